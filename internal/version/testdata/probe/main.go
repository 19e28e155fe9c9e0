// Command probe prints its version line; version_test.go builds it with LDFlags.
package main

import (
	"fmt"

	"github.com/tandem-epp/tandem/internal/version"
)

func main() { fmt.Println(version.Line("probe")) }

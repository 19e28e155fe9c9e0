// Package logging owns Tandem's logger: the --zap-* flags (the names and meanings
// controller-runtime's EPPs use, so GIE and llm-d manifests keep working) and the zap-backed
// logr.Logger they configure. It must not depend on Kubernetes client libraries: binaries built
// without Kubernetes support (-tags nokube) log through it too.
package logging

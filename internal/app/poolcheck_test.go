package app

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
)

// lines is a log a test may read while checkPool writes to it.
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) add(s string) { l.mu.Lock(); l.all = append(l.all, s); l.mu.Unlock() }
func (l *lines) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.all...)
}

// A role typo, a one-sided roleset and a bad annotation are said when the pool loads (not at
// the first request), once each, and again for a pod that joins later.
func TestCheckPoolWarnsAtLoadAndOnChange(t *testing.T) {
	var logged, reported lines
	log := funcr.New(func(prefix, args string) { logged.add(args) }, funcr.Options{})
	rep := config.ReporterFunc(func(pod, field, value string, err error) {
		reported.add(fmt.Sprintf("%s %s=%s: %v", pod, field, value, err))
	})
	pk, err := BuildPicker(PickerOptions{Gateway: config.DefaultGateway(), Reporter: rep, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	ep := func(name string, labels, annotations map[string]string) *pool.Endpoint {
		return pool.NewEndpoint("ns", name, "10.0.0.1", 8000, 0, labels, annotations)
	}
	first := []*pool.Endpoint{
		ep("p", map[string]string{"role-name": "prefil", "roleset-name": "g"}, nil),
		ep("d", map[string]string{"role-name": "decode", "roleset-name": "g"},
			map[string]string{pool.AnnotationConfig: `{"profiles":{"default":{"routingConfig":{"promptLenBucketMaxLength":"many"}}}}`}),
	}
	store := pool.NewStore()
	store.Publish(pool.Info{Name: "p"}, first, true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { checkPool(ctx, store, pk, log); close(done) }()
	defer func() { cancel(); <-done }()

	waitUntil(t, "the warnings of the first pool", func() bool { return len(logged.get()) >= 2 && len(reported.get()) >= 1 })
	all := strings.Join(logged.get(), "\n")
	for _, want := range []string{`role-name=\"prefil\" is not a role Tandem knows (did you mean \"prefill\"?)`, `roleset \"g\": decode pods (ns/d) but no prefill pod`} {
		if !strings.Contains(all, want) {
			t.Errorf("log lacks %s:\n%s", want, all)
		}
	}
	if r := reported.get(); !strings.Contains(r[0], "ns/d profiles.default.routingConfig.promptLenBucketMaxLength") {
		t.Errorf("annotation report: %q", r)
	}

	// The same pods again and a new bad one: only the new one is said.
	store.Publish(pool.Info{Name: "p"}, append(first, ep("x", map[string]string{"role-name": "decoder"}, nil)), true)
	waitUntil(t, "the new pod's warning", func() bool { return len(logged.get()) >= 3 })
	got := logged.get()
	if len(got) != 3 || !strings.Contains(got[2], `ns/x: role-name=\"decoder\"`) {
		t.Errorf("after the change the log is:\n%s", strings.Join(got, "\n"))
	}
	if r := reported.get(); len(r) != 1 {
		t.Errorf("an unchanged annotation was reported again: %q", r)
	}
}

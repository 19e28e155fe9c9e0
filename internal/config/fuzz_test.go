package config

import (
	"testing"

	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/wire"
)

// Any annotation value, however broken, resolves without a panic or an error.
func FuzzAnnotation(f *testing.F) {
	f.Add(profilesAnn)
	f.Add(`{"lockedRoutingStrategy":"pd","profiles":{"default":{"routingConfig":{"pd":{"minMatchPct":1e308}}}}}`)
	f.Add(`{"profiles":{"a":{"routingConfig":{"promptLenBucketMinLength":99999999999}}}}`)
	f.Add(`{"defaultProfile":null,"profiles":{"":{"routingConfig":null}}}`)
	f.Fuzz(func(t *testing.T, raw string) {
		r, err := NewResolver(DefaultGateway(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		e := pool.NewEndpoint("ns", "p", "10.0.0.1", 8000, 0, nil, map[string]string{pool.AnnotationConfig: raw})
		if _, err := r.ResolveEndpoints(map[string]string{wire.HeaderConfigProfile: "a"}, []*pool.Endpoint{e}); err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		_ = r.PodRouting(e, "a").Covers(100)
	})
}

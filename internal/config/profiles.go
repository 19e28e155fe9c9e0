package config

import (
	"fmt"
	"sync"

	"github.com/tandem-epp/tandem/internal/pool"
)

// Reporter receives the problems found in pods' model.aibrix.ai/config annotations: once per
// pod and distinct annotation value. field is the JSON path of the bad field (the annotation
// name when the whole value is unusable); err says the value, the rule and what Tandem did.
// Implementations must not block; they are called outside Tandem's locks.
type Reporter interface {
	BadAnnotation(podKey, field, value string, err error)
}

// ReporterFunc adapts a function to Reporter.
type ReporterFunc func(podKey, field, value string, err error)

// BadAnnotation implements Reporter.
func (f ReporterFunc) BadAnnotation(podKey, field, value string, err error) {
	f(podKey, field, value, err)
}

// modelView is one compiled annotation value: each profile with its effective settings, worked
// out once against the gateway configuration. Immutable; shared by every pod with that value.
type modelView struct {
	cfg         ModelConfig
	locked      string
	defaultName string
	profiles    map[string]*profileView
	defaultPV   *profileView // profiles[defaultName], nil when absent
	// auto are the profiles config-profile: auto chooses among; autoBounds the prompt-token
	// boundaries of their hints.
	auto       []autoCandidate
	autoBounds []int
}

type profileView struct {
	strategy string
	routing  RoutingConfig
	pd       PD
}

func (v *modelView) profile(name string) (string, *profileView) {
	if name == v.defaultName || name == "" {
		return v.defaultName, v.defaultPV
	}
	if p, ok := v.profiles[name]; ok {
		return name, p
	}
	return v.defaultName, v.defaultPV
}

// routing is the routingConfig of the named profile, else of the default one, else zero.
func (v *modelView) routing(profile string) RoutingConfig {
	if v != nil {
		if _, pv := v.profile(profile); pv != nil {
			return pv.routing
		}
	}
	return RoutingConfig{}
}

// Profiles caches the model config of every endpoint. Each distinct annotation value is parsed
// once; a pod whose annotation turns bad keeps its last good config (or none: the gateway
// defaults) and the problem goes to the Reporter. Lookups by endpoint are lock-free after the
// first; safe for concurrent use.
type Profiles struct {
	gw    Gateway
	names Names
	rep   Reporter

	byEndpoint sync.Map // *pool.Endpoint -> *modelView (nil: no config)

	mu     sync.Mutex
	pods   map[string]*podState // pod key -> state
	values map[string]*compiled // annotation value -> compiled result
}

type podState struct {
	value string     // the annotation value last seen on the pod
	good  *modelView // the last good config, nil when none
}

type compiled struct {
	view     *modelView // nil when fatal
	problems []*Problem
	fatal    error
}

// NewProfiles returns an empty cache that resolves profiles against gw. A nil rep discards reports.
func NewProfiles(gw Gateway, names Names, rep Reporter) *Profiles {
	if rep == nil {
		rep = ReporterFunc(func(string, string, string, error) {})
	}
	return &Profiles{gw: gw, names: names.withDefaults(), rep: rep,
		pods: map[string]*podState{}, values: map[string]*compiled{}}
}

// view returns the endpoint's model config, nil when it has none.
func (p *Profiles) view(e *pool.Endpoint) *modelView {
	if v, ok := p.byEndpoint.Load(e); ok {
		return v.(*modelView)
	}
	return p.slowView(e)
}

type report struct {
	field, value string
	err          error
}

func (p *Profiles) slowView(e *pool.Endpoint) *modelView {
	raw := e.Annotations[pool.AnnotationConfig]
	podKey := e.PodKey()
	var reports []report

	p.mu.Lock()
	st := p.pods[podKey]
	if st == nil || st.value != raw {
		prev := st
		st = &podState{value: raw}
		if raw != "" {
			c := p.compile(raw)
			st.good = c.view
			if c.fatal != nil {
				keep := "the gateway defaults apply"
				if prev != nil && prev.good != nil {
					st.good = prev.good
					keep = "the pod's last good config stays in use"
				}
				reports = append(reports, report{pool.AnnotationConfig, truncate(raw),
					fmt.Errorf("%s: %w; %s", pool.AnnotationConfig, c.fatal, keep)})
			}
			for _, pr := range c.problems {
				reports = append(reports, report{pr.Field, pr.Value, pr})
			}
		}
		p.pods[podKey] = st
	}
	view := st.good
	p.byEndpoint.Store(e, view)
	p.mu.Unlock()

	for _, r := range reports {
		p.rep.BadAnnotation(podKey, r.field, r.value, r.err)
	}
	return view
}

// compile parses and validates one annotation value, memoised by value. Callers hold p.mu.
func (p *Profiles) compile(raw string) *compiled {
	if c, ok := p.values[raw]; ok {
		return c
	}
	c := &compiled{}
	cfg, problems, err := ParseModelConfig(raw, p.names)
	c.problems = problems
	if err != nil {
		c.fatal = err
	} else {
		c.view = p.build(cfg, &c.problems)
	}
	p.values[raw] = c
	return c
}

// build works out each profile's effective settings: gateway values, then the profile's
// routingConfig fields, then its routingConfig.pd overrides.
func (p *Profiles) build(cfg ModelConfig, problems *[]*Problem) *modelView {
	v := &modelView{cfg: cfg, locked: cfg.LockedRoutingStrategy, defaultName: cfg.DefaultProfile,
		profiles: make(map[string]*profileView, len(cfg.Profiles))}
	if v.defaultName == "" {
		v.defaultName = DefaultProfileName
	}
	for name, prof := range cfg.Profiles {
		pv := &profileView{strategy: prof.RoutingStrategy, pd: p.gw.PD}
		if rc := prof.RoutingConfig; rc != nil {
			pv.routing = *rc
			d := &pv.pd
			if rc.PrefillScorePolicy != "" {
				d.PrefillScorePolicy = rc.PrefillScorePolicy
			}
			if rc.DecodeScorePolicy != "" {
				d.DecodeScorePolicy = rc.DecodeScorePolicy
			}
			if rc.PromptLengthBucketing != nil {
				d.PromptLengthBucketing = *rc.PromptLengthBucketing
			}
			if rc.BucketServe != nil {
				d.BucketServe = *rc.BucketServe
			}
			if rc.BucketServeMode != "" {
				d.BucketServeMode = rc.BucketServeMode
			}
			if rc.Handoff != "" {
				d.Handoff = rc.Handoff
			}
			if rc.TransferProof != "" {
				d.TransferProof = rc.TransferProof
			}
			pv.pd = rc.PD.apply(Gateway{PD: *d})
			if pv.pd.BucketServe && !pv.pd.PromptLengthBucketing {
				// Bucket serving plans over the buckets: without bucketing it cannot run.
				pv.pd.BucketServe = false
				if rc.BucketServe != nil {
					*problems = append(*problems, &Problem{Field: "profiles." + name + ".routingConfig.bucketServe", Value: "true",
						Rule: "needs prompt-length bucketing (AIBRIX_PROMPT_LENGTH_BUCKETING or routingConfig.promptLengthBucketing); override rejected"})
				}
			}
		}
		v.profiles[name] = pv
	}
	v.defaultPV = v.profiles[v.defaultName]
	v.auto, v.autoBounds = autoCandidates(cfg)
	return v
}

// PodRouting returns the routingConfig of the named profile in the pod's own annotation, else
// of the pod's default profile, else the zero RoutingConfig (which covers every prompt length).
func (p *Profiles) PodRouting(e *pool.Endpoint, profile string) RoutingConfig {
	return p.view(e).routing(profile)
}

// retain drops the cached state of endpoints and pods not in live.
func (p *Profiles) retain(live []*pool.Endpoint) {
	eps := make(map[*pool.Endpoint]struct{}, len(live))
	pods := make(map[string]struct{}, len(live))
	for _, e := range live {
		eps[e] = struct{}{}
		pods[e.PodKey()] = struct{}{}
	}
	p.byEndpoint.Range(func(k, _ any) bool {
		if _, ok := eps[k.(*pool.Endpoint)]; !ok {
			p.byEndpoint.Delete(k)
		}
		return true
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	values := map[string]struct{}{}
	for key, st := range p.pods {
		if _, ok := pods[key]; !ok {
			delete(p.pods, key)
			continue
		}
		values[st.value] = struct{}{}
	}
	for raw := range p.values {
		if _, ok := values[raw]; !ok {
			delete(p.values, raw)
		}
	}
}

func truncate(s string) string {
	if len(s) <= maxReportedAnnotationSize {
		return s
	}
	return s[:maxReportedAnnotationSize] + "…"
}

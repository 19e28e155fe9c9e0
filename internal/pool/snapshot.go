package pool

import (
	"sort"
	"sync"
	"sync/atomic"
)

// Info describes the InferencePool the endpoints belong to (empty fields for a file source).
type Info struct {
	Name        string
	Namespace   string
	TargetPorts []int32
	// AppProtocol is how the gateway speaks to the pool's model servers: "http" (HTTP/1.1)
	// or "kubernetes.io/h2c" (HTTP/2 cleartext); "" for a file source.
	AppProtocol string
}

// Snapshot is an immutable view of the pool. Readers never lock; sources publish a new one.
type Snapshot struct {
	Info      Info
	Endpoints []*Endpoint // sorted by Key
	// Synced is true once the source has delivered a complete view at least once.
	Synced bool
	// Version increases with every published snapshot.
	Version uint64

	byHostPort map[string]*Endpoint
	byAddress  map[string][]*Endpoint
	// models memoises OfModel's narrowed views (model name → endpoints), only for models some
	// endpoint is labelled with (labelled, worked out once), so a client's model names cannot
	// grow it.
	models       sync.Map
	labelledOnce sync.Once
	labelled     map[string]struct{}
	// rolesets memoises Rolesets.
	rolesetsOnce sync.Once
	rolesets     []*RolesetGroup
}

// Rolesets is Rolesets over the whole snapshot (every model's prefill and decode endpoints,
// grouped by model and roleset identity), worked out once per snapshot for all its readers.
// The groups are shared: a reader must not change them.
func (s *Snapshot) Rolesets() []*RolesetGroup {
	s.rolesetsOnce.Do(func() { s.rolesets = Rolesets(s.Endpoints) })
	return s.rolesets
}

// OfModel is the part of the snapshot a request for model may reach (ForModel over
// Endpoints). The view of a model some endpoint is labelled with is made once per snapshot
// (the whole of Endpoints when the pool holds no other model's pods), and is Owned.
func (s *Snapshot) OfModel(model string) []*Endpoint {
	s.labelledOnce.Do(func() {
		s.labelled = map[string]struct{}{}
		for _, e := range s.Endpoints {
			if e.Model != "" {
				s.labelled[e.Model] = struct{}{}
			}
		}
	})
	if _, ok := s.labelled[model]; !ok {
		return s.Endpoints // no endpoint carries the name: every one may serve it (ForModel)
	}
	if v, ok := s.models.Load(model); ok {
		return v.([]*Endpoint)
	}
	v, _ := s.models.LoadOrStore(model, ForModel(s.Endpoints, model))
	return v.([]*Endpoint)
}

// Owns reports whether eps is the snapshot's Endpoints or one of its OfModel views: a slice
// that stays as it is for the snapshot's life, so what is worked out from it may be kept
// with the snapshot.
func (s *Snapshot) Owns(eps []*Endpoint) bool {
	if sameEndpoints(eps, s.Endpoints) {
		return true
	}
	owned := false
	s.models.Range(func(_, v any) bool {
		owned = sameEndpoints(eps, v.([]*Endpoint))
		return !owned
	})
	return owned
}

// sameEndpoints reports whether a and b are the same slice (not only equal contents).
func sameEndpoints(a, b []*Endpoint) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// ForModel narrows eps to the endpoints of a request's model when any is labelled with it
// (model.aibrix.ai/name): a pool may hold pods of several models, and a pod answers only its
// own. Endpoints without the label stay (they serve whatever they are sent); endpoints
// labelled with another model leave. A model no endpoint is labelled with (a LoRA adapter, a
// pool without the label) may go to any of them, as in a GIE pool. eps is returned as it is,
// without a copy, when none leaves.
func ForModel(eps []*Endpoint, model string) []*Endpoint {
	if model == "" {
		return eps
	}
	same, other := 0, 0
	for _, e := range eps {
		switch e.Model {
		case model:
			same++
		case "":
		default:
			other++
		}
	}
	if same == 0 || other == 0 {
		return eps
	}
	out := make([]*Endpoint, 0, len(eps)-other)
	for _, e := range eps {
		if e.Model == model || e.Model == "" {
			out = append(out, e)
		}
	}
	return out
}

// ByHostPort finds the endpoint serving at "ip:port".
func (s *Snapshot) ByHostPort(hp string) (*Endpoint, bool) {
	e, ok := s.byHostPort[hp]
	return e, ok
}

// ByKey finds the endpoint keyed key ("namespace/pod:port").
func (s *Snapshot) ByKey(key string) (*Endpoint, bool) {
	i := sort.Search(len(s.Endpoints), func(i int) bool { return s.Endpoints[i].Key() >= key })
	if i < len(s.Endpoints) && s.Endpoints[i].Key() == key {
		return s.Endpoints[i], true
	}
	return nil, false
}

// Has reports whether the endpoint keyed key is in the snapshot.
func (s *Snapshot) Has(key string) bool {
	_, ok := s.ByKey(key)
	return ok
}

// Served is the endpoint of eps (a request's destination and fallbacks) serving at
// hostPort, as the gateway names the one that answered; nil when hostPort is empty or none
// of them serves there.
func Served(eps []*Endpoint, hostPort string) *Endpoint {
	if hostPort == "" {
		return nil
	}
	for _, e := range eps {
		if e.HostPort() == hostPort {
			return e
		}
	}
	return nil
}

// ByAddress lists the endpoints of the pod at an IP (one per target port).
func (s *Snapshot) ByAddress(ip string) []*Endpoint { return s.byAddress[ip] }

// Store holds the current Snapshot and lets sources replace it atomically.
type Store struct {
	cur     atomic.Pointer[Snapshot]
	mu      sync.Mutex // serialises writers only
	version uint64
	watch   []chan struct{}
	departs []*Departures
	// synced is the last synced snapshot, which departures are counted from (the store's empty
	// start, version 0, until one is published).
	synced *Snapshot
}

// Departures collects, from every Publish, the endpoint keys whose pod is not the one known
// under them before: keys that left the pool, came back at another address (the same name and
// port, another pod), or joined it after the first snapshot (whatever is known under such a key
// comes from a pod that was there before, or from requests that ended after it left), from one
// synced snapshot to the next, until Take: however the notifications coalesce, none between two
// Takes is lost.
type Departures struct {
	// C receives (coalesced) after each Publish that recorded a departure.
	C    <-chan struct{}
	c    chan struct{}
	mu   sync.Mutex
	keys map[string]struct{}
}

// Take returns the keys recorded since the last Take (nil: none) and forgets them.
func (d *Departures) Take() map[string]struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	keys := d.keys
	d.keys = nil
	return keys
}

// WatchDepartures starts recording departures from the next Publish on.
func (s *Store) WatchDepartures() *Departures {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := make(chan struct{}, 1)
	d := &Departures{C: c, c: c}
	s.departs = append(s.departs, d)
	return d
}

// recordDepartures notes, for every watcher, the endpoints of old missing from next or at
// another address there, and those of next that old did not have (unless old is the store's
// empty start). Under s.mu.
func (s *Store) recordDepartures(old, next *Snapshot) {
	if len(s.departs) == 0 {
		return
	}
	var gone []string
	for _, e := range old.Endpoints {
		if n, ok := next.ByKey(e.Key()); !ok || n.HostPort() != e.HostPort() {
			gone = append(gone, e.Key())
		}
	}
	if old.Version > 0 {
		for _, e := range next.Endpoints {
			if !old.Has(e.Key()) {
				gone = append(gone, e.Key())
			}
		}
	}
	if len(gone) == 0 {
		return
	}
	for _, d := range s.departs {
		d.mu.Lock()
		if d.keys == nil {
			d.keys = make(map[string]struct{}, len(gone))
		}
		for _, k := range gone {
			d.keys[k] = struct{}{}
		}
		d.mu.Unlock()
		select {
		case d.c <- struct{}{}:
		default:
		}
	}
}

// NewStore returns a store holding an empty, unsynced snapshot.
func NewStore() *Store {
	s := &Store{synced: newSnapshot(Info{}, nil, false, 0)}
	s.cur.Store(s.synced)
	return s
}

// Load returns the current snapshot. It never blocks.
func (s *Store) Load() *Snapshot { return s.cur.Load() }

// Publish replaces the snapshot with the given endpoints. The slice is copied and sorted.
func (s *Store) Publish(info Info, endpoints []*Endpoint, synced bool) *Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.version++
	snap := newSnapshot(info, endpoints, synced, s.version)
	if synced {
		// An unsynced snapshot (a source still listing, or one that lost its pool for a while)
		// says nothing of which pods left: departures are counted between synced ones.
		s.recordDepartures(s.synced, snap)
		s.synced = snap
	}
	s.cur.Store(snap)
	for _, ch := range s.watch {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	return snap
}

// Changes returns a channel that receives (coalesced) after each Publish.
func (s *Store) Changes() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{}, 1)
	s.watch = append(s.watch, ch)
	return ch
}

func newSnapshot(info Info, endpoints []*Endpoint, synced bool, version uint64) *Snapshot {
	eps := append([]*Endpoint(nil), endpoints...)
	sort.Slice(eps, func(i, j int) bool { return eps[i].Key() < eps[j].Key() })
	snap := &Snapshot{
		Info: info, Endpoints: eps, Synced: synced, Version: version,
		byHostPort: make(map[string]*Endpoint, len(eps)),
		byAddress:  make(map[string][]*Endpoint, len(eps)),
	}
	for _, e := range eps {
		snap.byHostPort[e.HostPort()] = e
		snap.byAddress[e.Address] = append(snap.byAddress[e.Address], e)
	}
	return snap
}

package ledger

import (
	"sync"
	"time"
)

// MaxSessionKeyBytes: longer session keys are ignored, as the seed says.
const MaxSessionKeyBytes = 256

// Sessions remembers the last prompt size of each x-aibrix-session-key (per model) for the
// session-delta charge. Bounded: once max keys are held, new keys are not recorded (logged
// once per time the table fills) until the janitor forgets expired ones. Safe for
// concurrent use.
type Sessions struct {
	o   Options
	max int

	mu     sync.Mutex
	m      map[sessionKey]sessionEntry
	warned bool
}

type sessionKey struct{ model, key string }

type sessionEntry struct {
	tokens  int
	expires time.Time
}

// NewSessions returns a table holding at most limit keys (at least 1).
func NewSessions(limit int, o Options) *Sessions {
	return &Sessions{o: o.withDefaults(), max: max(limit, 1), m: map[sessionKey]sessionEntry{}}
}

// Delta records promptTokens as the session's last prompt size and returns the growth since
// the previous one when a shorter prompt was seen within ttl. A ttl of 0 (the rule turned
// off), an empty key or a key over 256 bytes returns false and records nothing.
func (s *Sessions) Delta(model, key string, promptTokens int, ttl time.Duration) (int, bool) {
	if ttl <= 0 || key == "" || len(key) > MaxSessionKeyBytes {
		return 0, false
	}
	now := s.o.Clock.Now()
	k := sessionKey{model, key}
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, ok := s.m[k]
	if ok && !now.Before(prev.expires) {
		ok = false
	}
	if _, held := s.m[k]; held || len(s.m) < s.max {
		s.m[k] = sessionEntry{tokens: promptTokens, expires: now.Add(ttl)}
	} else if !s.warned {
		s.warned = true
		s.o.Logger.Info("token-load session table is full; new sessions are charged without a delta until idle ones expire",
			"max", s.max, "variable", "AIBRIX_TOKEN_LOAD_MAX_SESSIONS")
	}
	if ok && prev.tokens < promptTokens {
		return promptTokens - prev.tokens, true
	}
	return 0, false
}

// Len is the number of sessions held.
func (s *Sessions) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// Sweep forgets expired sessions.
func (s *Sessions) Sweep() {
	now := s.o.Clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, e := range s.m {
		if !now.Before(e.expires) {
			delete(s.m, k)
		}
	}
	if len(s.m) < s.max {
		s.warned = false
	}
}

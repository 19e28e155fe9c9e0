package objective

import "testing"

// Replace swaps the whole set; a name not in it is unknown (the caller's default priority).
func TestSetReplace(t *testing.T) {
	var s Set
	if _, ok := s.Priority(nil, "batch"); ok || s.Len() != 0 {
		t.Fatal("the zero Set knows no objective")
	}
	s.Replace(map[string]int{"batch": -1, "chat": 0})
	if p, ok := s.Priority(nil, "batch"); !ok || p != -1 {
		t.Errorf("batch: %d %v", p, ok)
	}
	if p, ok := s.Priority(nil, "chat"); !ok || p != 0 {
		t.Errorf("chat: %d %v", p, ok)
	}
	s.Replace(nil)
	if _, ok := s.Priority(nil, "batch"); ok || s.Len() != 0 {
		t.Error("Replace(nil) empties the set")
	}
}

// Two API groups: each replaces only its own objectives, and the first group of Kinds wins a
// name both define, whatever order they arrive in.
func TestSetSourcesMergeByPrecedence(t *testing.T) {
	s := &Set{sources: []string{Kinds[0].Group, Kinds[1].Group}}
	s.setSource(Kinds[1].Group, map[string]int{"both": -2, "old": -1})
	if p, _ := s.Priority(nil, "both"); p != -2 {
		t.Errorf("both from the older group alone: %d", p)
	}
	s.setSource(Kinds[0].Group, map[string]int{"both": 3, "new": 1})
	for name, want := range map[string]int{"both": 3, "old": -1, "new": 1} {
		if p, ok := s.Priority(nil, name); !ok || p != want {
			t.Errorf("%s: %d %v, want %d", name, p, ok, want)
		}
	}
	s.setSource(Kinds[0].Group, map[string]int{})
	if p, _ := s.Priority(nil, "both"); p != -2 || s.Len() != 2 {
		t.Errorf("after llm-d.ai's objectives went: both=%d, %d objectives", p, s.Len())
	}
}

package picker

import "testing"

// A key reads back only what was written under it, with its type; writing again replaces.
func TestCycleStateTypedKeys(t *testing.T) {
	var s CycleState
	n, m := NewStateKey[int]("a.count"), NewStateKey[string]("a.name")
	if _, ok := n.Read(&s); ok {
		t.Fatal("read from empty state")
	}
	n.Write(&s, 1)
	m.Write(&s, "x")
	n.Write(&s, 2)
	if v, ok := n.Read(&s); !ok || v != 2 {
		t.Fatalf("%v %v", v, ok)
	}
	if v, ok := m.Read(&s); !ok || v != "x" {
		t.Fatalf("%v %v", v, ok)
	}
	// The same name under another type is not readable as that type.
	if _, ok := NewStateKey[float64]("a.count").Read(&s); ok {
		t.Fatal("an int read back as a float64")
	}
	if v, ok := NewStateKey[int]("a.count").Read(&s); !ok || v != 2 {
		t.Fatal("an equal key does not read the value")
	}
}

package pool

import (
	"strings"
	"testing"
)

// Two pods pair when their Revisions are equal: a match label absent on both matches, one
// present on one side only does not, and an empty PairMatch pairs everything.
func TestPairMatchRevision(t *testing.T) {
	const rev, ver = LabelDisaggRevision, "app.kubernetes.io/version"
	both := PairMatch{rev, ver}
	cases := []struct {
		name         string
		match        PairMatch
		prefill, dec map[string]string
		wantP        string
		pair         bool
	}{
		{"no labels on either pod", both, nil, nil, "", true},
		{"same revision", both, map[string]string{rev: "a1"}, map[string]string{rev: "a1"}, rev + "=a1", true},
		{"two revisions", both, map[string]string{rev: "a1"}, map[string]string{rev: "b2"}, rev + "=a1", false},
		{"on the prefill pod only", both, map[string]string{rev: "a1"}, nil, rev + "=a1", false},
		{"present but empty on one side", both, map[string]string{rev: ""}, nil, rev + "=", false},
		{"both labels, in the configured order", both, map[string]string{ver: "1.2", rev: "a1"}, map[string]string{rev: "a1", ver: "1.2"}, rev + "=a1," + ver + "=1.2", true},
		{"the second label differs", both, map[string]string{ver: "1.2", rev: "a1"}, map[string]string{rev: "a1", ver: "1.3"}, rev + "=a1," + ver + "=1.2", false},
		{"a label not matched is ignored", PairMatch{ver}, map[string]string{rev: "a1"}, map[string]string{rev: "b2"}, "", true},
		{"none: everything pairs", nil, map[string]string{rev: "a1"}, map[string]string{rev: "b2"}, "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, d := tc.match.Revision(tc.prefill), tc.match.Revision(tc.dec)
			if p != tc.wantP {
				t.Errorf("prefill revision %q, want %q", p, tc.wantP)
			}
			if (p == d) != tc.pair {
				t.Errorf("revisions %q and %q: pair %v, want %v", p, d, p == d, tc.pair)
			}
		})
	}
}

func pmEndpoint(match PairMatch, name, role, roleset, rev string) *Endpoint {
	labels := map[string]string{LabelRoleName: role, LabelModelName: "m"}
	if roleset != "" {
		labels[LabelRolesetName] = roleset
	}
	if rev != "" {
		labels[LabelDisaggRevision] = rev
	}
	return match.NewEndpoint("ns", name, "10.0.0.1", 8000, 0, labels, nil)
}

// A roleset in the middle of a rolling update: revision a complete, revision b with a prefill
// pod only. It is two roleset identities; b's prefill pod is unpaired by the match labels,
// and a roleset that simply lacks a side is not counted as such.
func TestRolesetsSplitPerRevision(t *testing.T) {
	m := DefaultPairMatch
	eps := []*Endpoint{
		pmEndpoint(m, "p-a", "prefill", "rs", "a"),
		pmEndpoint(m, "d-a", "decode", "rs", "a"),
		pmEndpoint(m, "p-b", "prefill", "rs", "b"),
		pmEndpoint(m, "p-lone", "prefill", "lone", "a"),
		pmEndpoint(m, "std", "standard", "", ""),
	}
	groups := Rolesets(eps)
	var got []string
	for _, g := range groups {
		got = append(got, g.Key+":"+podNames(g.Prefill)+"|"+podNames(g.Decode))
	}
	want := "lone@" + LabelDisaggRevision + "=a:ns/p-lone|,rs@" + LabelDisaggRevision + "=a:ns/p-a|ns/d-a,rs@" + LabelDisaggRevision + "=b:ns/p-b|"
	if strings.Join(got, ",") != want {
		t.Errorf("groups %s\nwant   %s", strings.Join(got, ","), want)
	}
	if split := SplitByMatch(groups); len(split) != 1 || split[0] != groups[2] {
		t.Errorf("split by the match labels: %d groups, want rs@b only", len(split))
	}
	if g := groups[2]; g.Revision() != LabelDisaggRevision+"=b" || g.Name != "rs" || g.Complete() {
		t.Errorf("rs@b: revision %q name %q complete %v", g.Revision(), g.Name, g.Complete())
	}

	// Without match labels the same pods are one complete roleset rs.
	var plain []*Endpoint
	for _, e := range eps {
		plain = append(plain, NewEndpoint(e.Namespace, e.Name, e.Address, e.Port, e.Rank, e.Labels, nil))
	}
	if groups := Rolesets(plain); len(groups) != 2 || !groups[1].Complete() || len(groups[1].Prefill) != 2 || len(SplitByMatch(groups)) != 0 {
		t.Errorf("without match labels: %d groups", len(groups))
	}

	lint := strings.Join(lint(eps...), "\n")
	for _, w := range []string{
		`roleset "lone" (model "m"): prefill pods (ns/p-lone) but no decode pod`,
		`roleset "rs" (model "m"): prefill pods (ns/p-b) of revision ` + LabelDisaggRevision + `=b have no decode pod of the same revision, so the pair-match labels (TANDEM_PAIR_MATCH_LABELS) leave them unpaired`,
	} {
		if !strings.Contains(lint, w) {
			t.Errorf("Lint lacks %q:\n%s", w, lint)
		}
	}
}

// A snapshot groups its rolesets once: every call returns the same groups, those of Rolesets
// over all its endpoints (every model's), and a newer snapshot groups its own endpoints.
func TestSnapshotRolesetsGroupedOncePerSnapshot(t *testing.T) {
	m := DefaultPairMatch
	other := pmEndpoint(m, "p-other", "prefill", "rs", "a")
	other.Labels[LabelModelName], other.Model = "other", "other"
	store := NewStore()
	snap := store.Publish(Info{}, []*Endpoint{
		pmEndpoint(m, "p-a", "prefill", "rs", "a"),
		pmEndpoint(m, "d-a", "decode", "rs", "a"),
		pmEndpoint(m, "d-llmd", "decode", "", ""),
		pmEndpoint(m, "std", "standard", "", ""),
		other,
	}, true)
	keys := func(groups []*RolesetGroup) string {
		var out []string
		for _, g := range groups {
			out = append(out, g.Model+"/"+g.Key+":"+podNames(g.Prefill)+"|"+podNames(g.Decode))
		}
		return strings.Join(out, ",")
	}
	got, again := snap.Rolesets(), snap.Rolesets()
	want := "m/:|ns/d-llmd,m/rs@" + LabelDisaggRevision + "=a:ns/p-a|ns/d-a,other/rs@" + LabelDisaggRevision + "=a:ns/p-other|"
	if keys(got) != want || keys(got) != keys(Rolesets(snap.Endpoints)) {
		t.Errorf("groups %s\nwant   %s", keys(got), want)
	}
	if len(got) == 0 || len(again) != len(got) || again[0] != got[0] {
		t.Error("a second call grouped the snapshot again; want the groups of the first")
	}
	var rs []*Endpoint
	for _, e := range snap.Endpoints {
		if e.Model == "m" && e.Roleset == "rs" {
			rs = append(rs, e)
		}
	}
	next := store.Publish(Info{}, rs, true)
	if g := next.Rolesets(); len(g) != 1 || g[0] == got[0] || !g[0].Complete() {
		t.Errorf("the next snapshot: %s, want its own groups", keys(g))
	}
}

// Package podports turns one pod (or one file entry shaped like a pod) into the pool's
// endpoints: one per live target port, ranked by the port's index in the pool. Both pool
// sources (Kubernetes and file) call it, so a pod routes the same way with or without a cluster.
// It must not read the API server or the file system.
package podports

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tandem-epp/tandem/internal/pool"
)

// Endpoints returns one endpoint per target port that is live on the pod.
//
// The rules, in order:
//   - Rank is the index of the port in targetPorts (the data-parallel rank), whether or not
//     earlier ports are live.
//   - If the pod carries inference.networking.k8s.io/active-ports (or, when that one is absent,
//     llm-d.ai/active-ports), only the target ports listed there (comma-separated) are live.
//     Entries that are not target ports are ignored; a present but empty annotation means no
//     port is live.
//   - The endpoint's port is the target port, except that a pool with exactly one target port
//     uses the pod's model.aibrix.ai/port label when it is set (the seed's pods name their
//     serving port this way). With several target ports the label is ignored: each rank must
//     keep its own port.
//
// match reads each endpoint's Revision (the pair-match labels).
//
// Problems that do not stop the pod from routing (a malformed annotation entry, a bad port
// label) are returned as warnings; the Kubernetes source logs them, the file source refuses them.
func Endpoints(namespace, name, address string, targetPorts []int32, labels, annotations map[string]string, match pool.PairMatch) ([]*pool.Endpoint, []Warning) {
	active, restricted, warnings := activePorts(annotations)

	override := int32(0)
	if v, ok := labels[pool.LabelModelPort]; ok && len(targetPorts) == 1 {
		p, err := ParsePort(v)
		if err != nil {
			warnings = append(warnings, Warning{Field: `labels["` + pool.LabelModelPort + `"]`, Value: v,
				Problem: err.Error(), Effect: fmt.Sprintf("using target port %d", targetPorts[0])})
		} else {
			override = p
		}
	}

	eps := make([]*pool.Endpoint, 0, len(targetPorts))
	for rank, tp := range targetPorts {
		if restricted && !active[tp] {
			continue
		}
		port := tp
		if override != 0 {
			port = override
		}
		eps = append(eps, match.NewEndpoint(namespace, name, address, port, rank, labels, annotations))
	}
	return eps, warnings
}

// Warning is a pod field Tandem could not use.
type Warning struct {
	Field   string // as a path below the pod: labels["model.aibrix.ai/port"]
	Value   string
	Problem string // what is wrong with Value
	Effect  string // what Tandem does instead
}

func (w Warning) String() string {
	return fmt.Sprintf("%s=%q: %s; %s", w.Field, w.Value, w.Problem, w.Effect)
}

// ParsePort reads a TCP port number, 1–65535.
func ParsePort(s string) (int32, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not a port number", s)
	}
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("%d is out of range 1-65535", n)
	}
	return int32(n), nil
}

// activePorts reads the active-ports annotation. restricted is false when neither name is set.
func activePorts(annotations map[string]string) (active map[int32]bool, restricted bool, warnings []Warning) {
	key := pool.AnnotationActivePorts
	v, ok := annotations[key]
	if !ok {
		key = pool.AnnotationLLMDActivePorts
		if v, ok = annotations[key]; !ok {
			return nil, false, nil
		}
	}
	active = map[int32]bool{}
	for _, f := range strings.Split(v, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		p, err := ParsePort(f)
		if err != nil {
			warnings = append(warnings, Warning{Field: `annotations["` + key + `"]`, Value: v,
				Problem: err.Error(), Effect: "entry ignored"})
			continue
		}
		active[p] = true
	}
	return active, true, warnings
}

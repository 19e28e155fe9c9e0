package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// podNet gives every simulated pod an address of its own, as a cluster does: one network
// namespace per pod, joined to the host by a veth pair on a bridge the bench makes, on a
// /24 of the benchmarking range (198.18.0.0/15, RFC 2544) that leaves the machine through
// no interface. llm-d's simulator listens on every interface of its namespace and llm-d's pool
// gives every pod the same target port, which needs that; the traffic stays on this machine.
type podNet struct {
	bridge string
	subnet string // "198.18.x": the first three bytes of the pods' /24
	ns     []string
}

// ip is pod i's address on the run's /24: the bridge is .1, pod i is .(10+i).
func (n *podNet) ip(i int) string { return fmt.Sprintf("%s.%d", n.subnet, 10+i) }

// freeSubnet is the first /24 of 198.18.0.0/15 that no route of this machine's covers, so two
// benches (or a bench and a test) can run at once.
func freeSubnet() (string, error) {
	out, err := exec.Command("ip", "-4", "route", "show", "table", "all").Output()
	if err != nil {
		return "", fmt.Errorf("ip route: %w", err)
	}
	var used []*net.IPNet
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && slices.Contains(routeTypes, f[0]) {
			f = f[1:] // "local 198.18.0.1 dev …", "blackhole 198.18.3.0/24"
		}
		if len(f) == 0 {
			continue
		}
		dst := f[0]
		if !strings.Contains(dst, "/") {
			dst += "/32"
		}
		if _, n, err := net.ParseCIDR(dst); err == nil {
			used = append(used, n)
		}
	}
	for b := 0; b < 512; b++ {
		sub := fmt.Sprintf("198.%d.%d", 18+b/256, b%256)
		_, cand, _ := net.ParseCIDR(sub + ".0/24")
		if !slices.ContainsFunc(used, func(u *net.IPNet) bool { return overlaps(u, cand) }) {
			return sub, nil
		}
	}
	return "", errors.New("every /24 of 198.18.0.0/15 is routed on this machine: no subnet left for the pods")
}

// routeTypes are the words ip-route(8) may put before a route's destination.
var routeTypes = []string{"unicast", "local", "broadcast", "multicast", "anycast", "blackhole", "unreachable", "prohibit", "throw", "nat"}

// overlaps reports whether two networks share an address; a default route (0.0.0.0/0) covers
// everything but takes nothing, so it does not count.
func overlaps(a, b *net.IPNet) bool {
	if ones, _ := a.Mask.Size(); ones == 0 {
		return false
	}
	return a.Contains(b.IP) || b.Contains(a.IP)
}

// ipCmd runs ip(8) with args.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Name prefixes of what newPodNet makes, followed by its process's tag (pid % 100000).
const (
	bridgePrefix = "tlbr"
	nsPrefix     = "tlive"
)

// removeStale deletes the bridges and namespaces an earlier bench left behind when it was
// killed before it could (SIGKILL): those whose tag names no running bench-live. A leftover
// bridge holds the pods' subnet, which the next run's bridge needs.
func removeStale() {
	alive := func(tag string) bool {
		cmd, err := os.ReadFile("/proc/" + tag + "/cmdline")
		return err == nil && strings.Contains(string(cmd), "live")
	}
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
			tag, _, ok := strings.Cut(strings.TrimPrefix(name, nsPrefix), "-")
			if strings.HasPrefix(name, nsPrefix) && ok && tag != "" && !alive(tag) {
				_ = ipCmd("netns", "del", name)
			}
		}
	}
	if out, err := exec.Command("ip", "-o", "link", "show", "type", "bridge").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			// "57: tlbr6894: <BROADCAST,…"
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			name := strings.TrimSuffix(f[1], ":")
			if tag := strings.TrimPrefix(name, bridgePrefix); strings.HasPrefix(name, bridgePrefix) && tag != "" && !alive(tag) {
				_ = ipCmd("link", "del", name)
			}
		}
	}
}

// canMakeNamespaces says why this process cannot make network namespaces (not root, no
// ip(8), or no CAP_NET_ADMIN, as in an unprivileged container), or nil when it can.
func canMakeNamespaces() error {
	if os.Geteuid() != 0 {
		return errors.New("network namespaces for the pods need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("network namespaces for the pods need ip(8) (Debian's iproute2)")
	}
	probe := fmt.Sprintf("%sprobe%d", nsPrefix, os.Getpid())
	if err := ipCmd("netns", "add", probe); err != nil {
		return fmt.Errorf("this process may not make network namespaces (CAP_NET_ADMIN): %w", err)
	}
	return ipCmd("netns", "del", probe)
}

// newPodNet makes the bridge and n namespaces (root only: the bench must run as root for them),
// after removing what a killed earlier run left.
func newPodNet(n int) (pn *podNet, err error) {
	if err := canMakeNamespaces(); err != nil {
		return nil, fmt.Errorf("%w; run as root with CAP_NET_ADMIN or leave llm-d's EPP out (-llmd-epp \"\")", err)
	}
	removeStale()
	tag := os.Getpid() % 100000
	sub, err := freeSubnet()
	if err != nil {
		return nil, err
	}
	pn = &podNet{bridge: fmt.Sprintf("%s%d", bridgePrefix, tag), subnet: sub}
	defer func() {
		if err != nil {
			pn.close()
		}
	}()
	for _, a := range [][]string{
		{"link", "add", pn.bridge, "type", "bridge"},
		{"addr", "add", sub + ".1/24", "dev", pn.bridge},
		{"link", "set", pn.bridge, "up"},
	} {
		if err := ipCmd(a...); err != nil {
			return pn, err
		}
	}
	for i := range n {
		ns := fmt.Sprintf("%s%d-%d", nsPrefix, tag, i)
		host := fmt.Sprintf("tl%dh%d", tag, i)
		if err := ipCmd("netns", "add", ns); err != nil {
			return pn, err
		}
		pn.ns = append(pn.ns, ns)
		for _, a := range [][]string{
			{"-n", ns, "link", "set", "lo", "up"},
			{"link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns},
			{"link", "set", host, "master", pn.bridge},
			{"link", "set", host, "up"},
			{"-n", ns, "addr", "add", pn.ip(i) + "/24", "dev", "eth0"},
			{"-n", ns, "link", "set", "eth0", "up"},
		} {
			if err := ipCmd(a...); err != nil {
				return pn, err
			}
		}
	}
	return pn, nil
}

// close deletes the namespaces (their veth ends go with them) and the bridge.
func (n *podNet) close() {
	for _, ns := range n.ns {
		_ = ipCmd("netns", "del", ns)
	}
	_ = ipCmd("link", "del", n.bridge)
}

// wrap is the command line running bin with args inside pod i's namespace.
func (n *podNet) wrap(i int, bin string, args []string) (string, []string) {
	return "ip", append([]string{"netns", "exec", n.ns[i], bin}, args...)
}

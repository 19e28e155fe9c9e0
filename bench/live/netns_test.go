package main

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// What a bench killed with SIGKILL left (its namespaces and its bridge, which holds the pods'
// subnet) is removed by the next run; what a running bench made is not.
func TestLeftoversOfAKilledRunAreRemoved(t *testing.T) {
	needNetAdmin(t)
	dead := ""
	for pid := 99999; pid > 90000; pid-- {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); os.IsNotExist(err) {
			dead = strconv.Itoa(pid)
			break
		}
	}
	if dead == "" {
		t.Skip("no free pid to name a dead run by")
	}
	ns, bridge := nsPrefix+dead+"-0", bridgePrefix+dead
	// A run that is alive: this test's own process (its command line holds "live").
	self := strconv.Itoa(os.Getpid())
	liveNS := nsPrefix + self + "-0"
	for _, a := range [][]string{{"netns", "add", ns}, {"link", "add", bridge, "type", "bridge"}, {"netns", "add", liveNS}} {
		if err := ipCmd(a...); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = ipCmd("netns", "del", ns)
		_ = ipCmd("link", "del", bridge)
		_ = ipCmd("netns", "del", liveNS)
	})
	removeStale()
	out, _ := exec.Command("ip", "netns", "list").Output()
	if strings.Contains(string(out), ns+" ") || strings.Contains(string(out), ns+"\n") {
		t.Errorf("the dead run's namespace %s is still there:\n%s", ns, out)
	}
	if !strings.Contains(string(out), liveNS) {
		t.Errorf("a running bench's namespace %s was removed", liveNS)
	}
	if err := exec.Command("ip", "link", "show", bridge).Run(); err == nil {
		t.Errorf("the dead run's bridge %s is still there", bridge)
	}
}

// needNetAdmin skips a test that makes namespaces and links where this process cannot.
func needNetAdmin(t *testing.T) {
	t.Helper()
	if err := canMakeNamespaces(); err != nil {
		t.Skip(err)
	}
}

// A /24 a route of this machine covers is not handed to the pods.
func TestFreeSubnetAvoidsARoutedOne(t *testing.T) {
	needNetAdmin(t)
	first, err := freeSubnet()
	if err != nil {
		t.Fatal(err)
	}
	bridge := bridgePrefix + "t" + strconv.Itoa(os.Getpid()%10000)
	if err := ipCmd("link", "add", bridge, "type", "bridge"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ipCmd("link", "del", bridge) })
	for _, a := range [][]string{{"addr", "add", first + ".1/24", "dev", bridge}, {"link", "set", bridge, "up"}} {
		if err := ipCmd(a...); err != nil {
			t.Fatal(err)
		}
	}
	next, err := freeSubnet()
	if err != nil {
		t.Fatal(err)
	}
	if next == first {
		t.Errorf("freeSubnet gave %s.0/24 again while %s holds it", next, bridge)
	}
	_, a, _ := net.ParseCIDR("198.18.0.0/16")
	_, b, _ := net.ParseCIDR("198.18.7.0/24")
	_, all, _ := net.ParseCIDR("0.0.0.0/0")
	if !overlaps(a, b) || !overlaps(b, a) || overlaps(all, b) {
		t.Error("overlaps: a /16 and a /24 inside it must overlap both ways; a default route overlaps nothing")
	}
}

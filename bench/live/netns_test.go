package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// What a bench killed with SIGKILL left (its namespaces and its bridge, which holds the pods'
// subnet) is removed by the next run; what a running bench made is not.
func TestLeftoversOfAKilledRunAreRemoved(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip(8)")
	}
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

package testnet

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

func TestRefusedAddrRefusesAndStaysReserved(t *testing.T) {
	addr := RefusedAddr(t)
	_, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v, want connection refused", addr, err)
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("listen on %s succeeded: the port is not reserved", addr)
	}
	if p := RefusedPort(t); p <= 0 || p > 65535 {
		t.Fatalf("RefusedPort = %d", p)
	}
}

// Package testnet gives tests loopback addresses with a known behaviour. An address found by
// listening on port 0 and closing the listener can be taken by any other process before the test
// dials it (the suite runs packages in parallel), and a listener that accepts and never answers
// turns "connection refused" into a hang; the addresses here stay reserved until the test ends.
// It must not be imported by production code.
package testnet

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// RefusedAddr returns a "127.0.0.1:port" that refuses every connection until the test ends: a
// TCP socket bound to it without listening holds the port (nothing else can bind it, and the
// kernel does not hand it out as an ephemeral port), and a connect to it is answered with a reset.
func RefusedAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatalf("testnet: socket: %v", err)
	}
	syscall.CloseOnExec(fd)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("testnet: bind 127.0.0.1:0: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("testnet: getsockname: %v", err)
	}
	in4, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		t.Fatalf("testnet: bound address is %T, want IPv4", sa)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(in4.Port))
}

// RefusedPort is RefusedAddr's port.
func RefusedPort(t testing.TB) int {
	t.Helper()
	_, p, _ := net.SplitHostPort(RefusedAddr(t))
	port, _ := strconv.Atoi(p)
	return port
}

package demo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// healthService is the gRPC health service Tandem turns SERVING once its pool has synced.
const healthService = "inference-extension"

// ErrExited is what WaitServing's error wraps when Tandem exited before it was SERVING; the
// exit has then been taken from the exited channel.
var ErrExited = errors.New("tandem exited before it was SERVING")

// WaitServing waits until Tandem's gRPC health service "inference-extension" at addr is
// SERVING (its pool has synced), Tandem exits (a value on exited; nil if there is no such
// signal), ctx ends or limit passes. Tandem may still be starting: the watch waits for the
// health listener to accept.
func WaitServing(ctx context.Context, addr string, exited <-chan error, limit time.Duration) error {
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	serving := make(chan error, 1)
	go func() { serving <- watchServing(ctx, conn) }()
	select {
	case err := <-serving:
		if err != nil {
			return fmt.Errorf("not SERVING on %s (gRPC health, service %s) within %v: %w", addr, healthService, limit, err)
		}
		return nil
	case err := <-exited:
		cancel()
		<-serving
		if err == nil {
			return ErrExited
		}
		return fmt.Errorf("%w: %w", ErrExited, err)
	}
}

func watchServing(ctx context.Context, conn *grpc.ClientConn) error {
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: healthService}, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	for {
		r, err := w.Recv()
		if err != nil {
			return err
		}
		if r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
	}
}

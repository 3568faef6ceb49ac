package gantry

import (
	"context"
	"sync/atomic"
	"testing"

	gantryv1 "github.com/gantry-dev/gantry/clients/go/gantry/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// lossy forwards every call to the store and, for the first `lose`
// updates, answers an error instead of the store's answer: with
// `landed`, after the update committed (its answer lost); without, before
// sending it.
type lossy struct {
	gantryv1.GatewayServiceClient
	lose   int32
	landed bool
	err    error
}

func (l *lossy) UpdateGateway(ctx context.Context, in *gantryv1.UpdateGatewayRequest, opts ...grpc.CallOption) (*gantryv1.Gateway, error) {
	if atomic.AddInt32(&l.lose, -1) < 0 {
		return l.GatewayServiceClient.UpdateGateway(ctx, in, opts...)
	}
	if l.landed {
		if _, err := l.GatewayServiceClient.UpdateGateway(ctx, in, opts...); err != nil {
			return nil, err
		}
	}
	return nil, l.err
}

func unknownOutcome() error {
	s, _ := status.New(codes.Unavailable, "the write's outcome is unknown").WithDetails(
		&errdetails.ErrorInfo{Reason: ReasonCommitOutcomeUnknown, Domain: "gantry.dev"})
	return s.Err()
}

// A conflict with another writer and a write whose answer was lost both
// end with the change applied exactly once on top of the other writer's.
func TestRetryOnConflictResolvesConflictsAndUnknownOutcomes(t *testing.T) {
	s := startStore(t)
	client := connect(t, s)
	w := &writer{t: t, client: client}
	ctx := context.Background()
	for _, name := range []string{"conflict", "landed", "lost"} {
		w.create(name)
	}

	// The reconciler's status write (here: a colleague's label) lands
	// between the read and the write of the first attempt.
	calls := 0
	updated, err := RetryOnConflict(ctx, client, "conflict", []string{"spec.image"}, func(g *gantryv1.Gateway) error {
		calls++
		if calls == 1 {
			_, err := client.UpdateGateway(ctx, &gantryv1.UpdateGatewayRequest{
				Gateway: &gantryv1.Gateway{Metadata: &gantryv1.ObjectMeta{
					Name: "conflict", Labels: map[string]string{"owner": "bob"}}},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"metadata.labels"}},
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		g.Spec.Image = "ghcr.io/acme/gw:2"
		return nil
	})
	if err != nil || calls != 2 {
		t.Fatalf("after %d attempts: %v", calls, err)
	}
	if updated.GetSpec().GetImage() != "ghcr.io/acme/gw:2" || updated.GetMetadata().GetLabels()["owner"] != "bob" {
		t.Fatalf("the change or the colleague's label is missing: %v", updated)
	}

	// Committed, answer lost; and not committed, connection broken.
	for name, client := range map[string]*lossy{
		"landed": {GatewayServiceClient: client, lose: 1, landed: true, err: unknownOutcome()},
		"lost":   {GatewayServiceClient: client, lose: 2, err: status.Error(codes.Unavailable, "connection reset")},
	} {
		updated, err := RetryOnConflict(ctx, client, name, []string{"spec.image"}, func(g *gantryv1.Gateway) error {
			g.Spec.Image = "ghcr.io/acme/gw:2"
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if updated.GetSpec().GetImage() != "ghcr.io/acme/gw:2" || updated.GetMetadata().GetGeneration() != 2 {
			t.Fatalf("%s: the change is not there exactly once: %v", name, updated)
		}
	}

	// What retrying cannot fix ends at once.
	calls = 0
	_, err = RetryOnConflict(ctx, client, "conflict", []string{"spec.image"}, func(g *gantryv1.Gateway) error {
		calls++
		g.Spec.Image = ""
		return nil
	})
	if status.Code(err) != codes.InvalidArgument || calls != 1 {
		t.Fatalf("an invalid change after %d attempts: %v", calls, err)
	}
}

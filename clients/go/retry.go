package gantry

import (
	"context"
	"errors"
	"time"

	gantryv1 "github.com/gantry-dev/gantry/clients/go/gantry/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// Reasons in google.rpc.ErrorInfo of an UNAVAILABLE write: whether it may
// have committed.
const (
	// ReasonCommitOutcomeUnknown: the commit was sent and failed on the
	// way; it may have committed (read back before retrying).
	ReasonCommitOutcomeUnknown = "COMMIT_OUTCOME_UNKNOWN"
	// ReasonNotCommitted: nothing was written; retrying is safe.
	ReasonNotCommitted = "NOT_COMMITTED"
)

// DefaultRetry is the Backoff of RetryOnConflict: 10ms doubling to 1s,
// half jitter, at most DefaultRetrySteps attempts.
var DefaultRetry = Backoff{Initial: 10 * time.Millisecond, Max: time.Second, Jitter: 0.5}

// DefaultRetrySteps bounds the attempts of RetryOnConflict.
const DefaultRetrySteps = 8

// Mutate changes a gateway read from the store into what should be
// written. It must compute the change from the gateway it is given (set
// the image to X, add label Y), not from a value read earlier, because it
// runs again on a fresh read after every conflict.
type Mutate func(*gantryv1.Gateway) error

// RetryOnConflict is a read-modify-write of the gateway name, as
// client-go's retry.RetryOnConflict: it reads the gateway, lets mutate
// change it, and writes the paths of mask (for example "spec.image",
// "metadata.labels") conditional on the version it read. It starts again
// from a fresh read, after a backoff, when:
//
//   - someone else wrote in between (ABORTED), for example the reconciler
//     writing status right after a create;
//   - the store says nothing was written (UNAVAILABLE, NOT_COMMITTED);
//   - the outcome is unknown (UNAVAILABLE with COMMIT_OUTCOME_UNKNOWN, or
//     no answer at all): the write was conditional, so if it did commit the
//     fresh read shows it and mutate sees its own change; if it did not,
//     the version is unchanged and the same write is sent again.
//
// Any other error, a mutate error, or DefaultRetrySteps attempts end it.
// It answers the gateway as written.
func RetryOnConflict(ctx context.Context, client gantryv1.GatewayServiceClient, name string, mask []string, mutate Mutate) (*gantryv1.Gateway, error) {
	var last error
	for attempt := 0; attempt < DefaultRetrySteps; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return nil, errors.Join(ctx.Err(), last)
			case <-time.After(DefaultRetry.Delay(attempt - 1)):
			}
		}
		current, err := client.GetGateway(ctx, &gantryv1.GetGatewayRequest{Name: name})
		if err != nil {
			if retryable(err) {
				last = err
				continue
			}
			return nil, err
		}
		read := current.GetMetadata().GetResourceVersion()
		if err := mutate(current); err != nil {
			return nil, err
		}
		// The condition: the version read, whatever mutate did to it.
		if current.Metadata == nil {
			current.Metadata = &gantryv1.ObjectMeta{}
		}
		current.Metadata.Name, current.Metadata.ResourceVersion = name, read
		written, err := client.UpdateGateway(ctx, &gantryv1.UpdateGatewayRequest{
			Gateway:    current,
			UpdateMask: &fieldmaskpb.FieldMask{Paths: mask},
		})
		if err == nil {
			return written, nil
		}
		if !retryable(err) {
			return nil, err
		}
		last = err
	}
	return nil, last
}

// retryable: a conflict, or a write that did not commit or may have
// (resolved by reading again).
func retryable(err error) bool {
	if IsConflict(err) {
		return true
	}
	switch reason(err) {
	case ReasonCommitOutcomeUnknown, ReasonNotCommitted:
		return true
	case "":
		// No answer from the store itself: the connection broke.
		return status.Code(err) == codes.Unavailable
	}
	return false
}

// IsConflict says whether err is a conditional write that lost to another
// writer (ABORTED): read again and decide.
func IsConflict(err error) bool {
	return status.Code(err) == codes.Aborted
}

// reason is the gantry ErrorInfo reason of err ("" without one).
func reason(err error) string {
	s, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, detail := range s.Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

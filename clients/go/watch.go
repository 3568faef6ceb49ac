// Package gantry is the Go client of gantry's gateway-store: the API
// generated from proto/ (package gantryv1 in gantry/v1) and ListThenWatch,
// the list-then-watch loop every subscriber of the store runs, with the
// same contract as the Rust client's list_then_watch.
package gantry

import (
	"context"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"time"

	gantryv1 "github.com/gantry-dev/gantry/clients/go/gantry/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Reasons in google.rpc.ErrorInfo of an OUT_OF_RANGE watch: the revision
// is outside the store's history (compacted, or newer than its head after
// a restore); either way the subscriber lists again.
const (
	ReasonRevisionCompacted = "REVISION_COMPACTED"
	ReasonRevisionFuture    = "REVISION_FUTURE"
)

// Kind says what an Update is.
type Kind int

const (
	// Init begins a (re)list: the pages up to InitDone are the complete
	// selected set at Revision.
	Init Kind = iota
	// InitPage is one page of that list (Gateways).
	InitPage
	// InitDone ends the list: a gateway cached before it and not in its
	// pages is gone; changes after Revision follow.
	InitDone
	// Applied: Gateway was added or changed (or entered the selection).
	Applied
	// Deleted: Gateway was removed (or left the selection); its last state.
	Deleted
	// Bookmark: every change up to Revision has been delivered.
	Bookmark
	// Interrupted: the store was lost (unreachable, unavailable, or it
	// ended the watch); the loop tries again in RetryIn. Nothing about the
	// gateways changed; Revision is that of the last update delivered.
	Interrupted
)

// String is the kind's name, as printed.
func (k Kind) String() string {
	return [...]string{"Init", "InitPage", "InitDone", "Applied", "Deleted", "Bookmark", "Interrupted"}[k]
}

// Update is one step of the watched set.
type Update struct {
	Kind     Kind
	Revision int64
	// Gateways of an InitPage.
	Gateways []*gantryv1.Gateway
	// Gateway of Applied and Deleted.
	Gateway *gantryv1.Gateway
	// Err and RetryIn of Interrupted.
	Err     error
	RetryIn time.Duration
}

// Backoff between failed attempts: Initial doubled per consecutive
// failure up to Max, less a random share of up to Jitter (0..1).
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
	Jitter  float64
}

// Delay is the wait before retry number attempt (0-based).
func (b Backoff) Delay(attempt int) time.Duration {
	full := math.Min(float64(b.Initial)*math.Pow(2, math.Min(float64(attempt), 62)), float64(b.Max))
	jitter := math.Max(0, math.Min(1, b.Jitter))
	return time.Duration(full * (1 - jitter*rand.Float64()))
}

// WatchOptions says what to watch and how patiently.
type WatchOptions struct {
	// LabelSelector selects gateways on the server (Kubernetes syntax).
	LabelSelector string
	// Name, when set, watches only that gateway.
	Name string
	// PageSize of the lists (0: 500).
	PageSize int32
	// Backoff between failed attempts (zero: 100ms doubling to 10s, half
	// jitter, as the Rust client).
	Backoff Backoff
	// ResumeFrom, when non-zero, starts with a watch from this revision
	// (saved from an earlier run) instead of a list; if the store no
	// longer has it, the loop lists.
	ResumeFrom int64
}

// ErrStopped is returned when the handler asked the loop to stop.
var ErrStopped = errors.New("gantry: the handler stopped the watch")

// ListThenWatch lists the selected gateways page by page and then
// watches every change after the list's revision, calling handle for
// each update in order. After a disconnect it resumes from the last
// revision delivered; when that revision is outside the store's history
// (OUT_OF_RANGE, REVISION_COMPACTED) it lists again. Between attempts it
// backs off with jitter, and says so (Interrupted). It returns ctx's
// error when ctx is done, ErrStopped (wrapping the handler's error) when
// handle fails, or an error retrying cannot fix: UNAUTHENTICATED,
// PERMISSION_DENIED, INVALID_ARGUMENT, UNIMPLEMENTED.
func ListThenWatch(ctx context.Context, client gantryv1.GatewayServiceClient, opts WatchOptions, handle func(Update) error) error {
	if opts.PageSize == 0 {
		opts.PageSize = 500
	}
	if opts.Backoff == (Backoff{}) {
		opts.Backoff = Backoff{Initial: 100 * time.Millisecond, Max: 10 * time.Second, Jitter: 0.5}
	}
	l := loop{client: client, opts: opts, handle: handle, revision: opts.ResumeFrom, listed: opts.ResumeFrom != 0}
	failures := 0
	for {
		err := l.attempt(ctx, &failures)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var stopped handlerError
		if errors.As(err, &stopped) {
			return errors.Join(ErrStopped, stopped.err)
		}
		if permanent(err) {
			return err
		}
		if compacted(err) {
			l.listed = false
			// A relist right away is normal; relisting again and again
			// (history shorter than the write rate) backs off.
			if failures == 0 {
				failures = 1
				continue
			}
		}
		delay := opts.Backoff.Delay(failures)
		failures++
		if err := l.deliver(Update{Kind: Interrupted, Revision: l.delivered, Err: err, RetryIn: delay}); err != nil {
			return errors.Join(ErrStopped, err.(handlerError).err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

type loop struct {
	client    gantryv1.GatewayServiceClient
	opts      WatchOptions
	handle    func(Update) error
	revision  int64
	listed    bool
	delivered int64
}

// handlerError marks an error of the handler (not of the store).
type handlerError struct{ err error }

func (h handlerError) Error() string { return h.err.Error() }

func (l *loop) deliver(u Update) error {
	if err := l.handle(u); err != nil {
		return handlerError{err}
	}
	l.delivered = u.Revision
	return nil
}

func (l *loop) attempt(ctx context.Context, failures *int) error {
	if !l.listed {
		revision, err := l.list(ctx)
		if err != nil {
			return err
		}
		l.revision, l.listed = revision, true
	}
	stream, err := l.client.WatchGateways(ctx, &gantryv1.WatchGatewaysRequest{
		ResourceVersion: l.revision,
		AllowBookmarks:  true,
		LabelSelector:   l.opts.LabelSelector,
		Name:            l.opts.Name,
	})
	if err != nil {
		return err
	}
	for {
		event, err := stream.Recv()
		if err == io.EOF {
			return status.Error(codes.Unavailable, "the watch stream ended")
		}
		if err != nil {
			return err
		}
		*failures = 0
		var u Update
		switch event.GetType() {
		case gantryv1.EventType_EVENT_TYPE_ADDED, gantryv1.EventType_EVENT_TYPE_MODIFIED:
			u = Update{Kind: Applied, Gateway: event.GetGateway()}
		case gantryv1.EventType_EVENT_TYPE_DELETED:
			u = Update{Kind: Deleted, Gateway: event.GetGateway()}
		case gantryv1.EventType_EVENT_TYPE_BOOKMARK:
			u = Update{Kind: Bookmark}
		default:
			continue
		}
		if u.Kind != Bookmark && u.Gateway == nil {
			continue
		}
		u.Revision = event.GetResourceVersion()
		if err := l.deliver(u); err != nil {
			return err
		}
		l.revision = u.Revision
	}
}

// list delivers one list page by page; the list's revision.
func (l *loop) list(ctx context.Context) (int64, error) {
	token, revision, started := "", int64(0), false
	for {
		page, err := l.client.ListGateways(ctx, &gantryv1.ListGatewaysRequest{
			PageSize:      l.opts.PageSize,
			PageToken:     token,
			LabelSelector: l.opts.LabelSelector,
		})
		if err != nil {
			return 0, err
		}
		// The list is the snapshot at the first page's revision.
		if !started {
			revision, started = page.GetResourceVersion(), true
			if err := l.deliver(Update{Kind: Init, Revision: revision}); err != nil {
				return 0, err
			}
		}
		var gateways []*gantryv1.Gateway
		for _, g := range page.GetGateways() {
			if l.opts.Name == "" || g.GetMetadata().GetName() == l.opts.Name {
				gateways = append(gateways, g)
			}
		}
		if len(gateways) > 0 {
			if err := l.deliver(Update{Kind: InitPage, Revision: revision, Gateways: gateways}); err != nil {
				return 0, err
			}
		}
		if page.GetNextPageToken() == "" {
			return revision, l.deliver(Update{Kind: InitDone, Revision: revision})
		}
		token = page.GetNextPageToken()
	}
}

// permanent: errors retrying cannot fix.
func permanent(err error) bool {
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied, codes.InvalidArgument, codes.Unimplemented:
		return true
	}
	return false
}

// compacted: the watched revision is outside the store's history.
func compacted(err error) bool {
	if status.Code(err) != codes.OutOfRange {
		return false
	}
	r := reason(err)
	return r == ReasonRevisionCompacted || r == ReasonRevisionFuture
}

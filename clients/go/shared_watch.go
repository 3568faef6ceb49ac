package gantry

import (
	"context"
	"errors"
	"sync"

	gantryv1 "github.com/gantry-dev/gantry/clients/go/gantry/v1"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// sharedBuffer is the events a watch of a SharedWatch buffers for its
// reader before it holds the stream's other watches back.
const sharedBuffer = 64

// SharedWatch carries several watches on one Watch stream (as etcd's
// client shares a stream among the watches of a context): each Watcher
// delivers what a WatchGateways stream with the same request would, and
// ends with the same status, while the connection holds one HTTP/2
// stream for all of them. A watcher whose reader falls sharedBuffer events
// behind holds the others back until it reads.
type SharedWatch struct {
	stream gantryv1.GatewayService_WatchClient
	sendMu sync.Mutex

	mu     sync.Mutex
	next   int64
	routes map[int64]*Watcher
	err    error // why the stream ended, once it did
}

// Watcher is one watch of a SharedWatch.
type Watcher struct {
	id      int64
	shared  *SharedWatch
	created chan error
	events  chan *gantryv1.WatchEvent
	started bool  // the store said created (read and written by route)
	err     error // set before events is closed
}

// OpenSharedWatch opens a Watch stream; it ends with ctx.
func OpenSharedWatch(ctx context.Context, client gantryv1.GatewayServiceClient) (*SharedWatch, error) {
	stream, err := client.Watch(ctx)
	if err != nil {
		return nil, err
	}
	s := &SharedWatch{stream: stream, routes: map[int64]*Watcher{}}
	go s.route()
	return s, nil
}

// Watch starts one watch: its Watcher once the store started it, or the
// status it was refused with.
func (s *SharedWatch) Watch(ctx context.Context, request *gantryv1.WatchGatewaysRequest) (*Watcher, error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, s.err
	}
	s.next++
	w := &Watcher{id: s.next, shared: s, created: make(chan error, 1), events: make(chan *gantryv1.WatchEvent, sharedBuffer)}
	s.routes[w.id] = w
	s.mu.Unlock()
	create := &gantryv1.WatchCreate{WatchId: w.id, Watch: request}
	if err := s.send(&gantryv1.WatchRequest{Request: &gantryv1.WatchRequest_Create{Create: create}}); err != nil {
		return nil, err
	}
	select {
	case err := <-w.created:
		if err != nil {
			return nil, err
		}
		return w, nil
	case <-ctx.Done():
		w.Cancel()
		return nil, ctx.Err()
	}
}

func (s *SharedWatch) send(request *gantryv1.WatchRequest) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.stream.Send(request)
}

// endStatus is the status a response that ends a watch carries: nil when
// the client cancelled it.
func endStatus(r *gantryv1.WatchResponse) error {
	if r.GetCode() == 0 {
		return nil
	}
	var details spb.Status
	if err := proto.Unmarshal(r.GetDetails(), &details); err != nil || details.GetCode() == 0 {
		return status.Error(codes.Code(r.GetCode()), r.GetMessage())
	}
	return status.ErrorProto(&details)
}

// route delivers each response to its watcher until the stream ends,
// then ends every watcher still open with the stream's error.
func (s *SharedWatch) route() {
	var ended error
	for {
		r, err := s.stream.Recv()
		if err != nil {
			ended = err
			break
		}
		s.mu.Lock()
		w := s.routes[r.GetWatchId()]
		if w != nil && r.GetCanceled() {
			delete(s.routes, r.GetWatchId())
		}
		s.mu.Unlock()
		if w == nil {
			continue
		}
		if r.GetCreated() {
			w.started = true
			w.created <- nil
		}
		for _, e := range r.GetEvents() {
			w.events <- e
		}
		if r.GetCanceled() {
			w.finish(endStatus(r))
		}
	}
	s.mu.Lock()
	s.err = ended
	open := s.routes
	s.routes = map[int64]*Watcher{}
	s.mu.Unlock()
	for _, w := range open {
		w.finish(ended)
	}
}

// finish ends the watcher with err (nil: cancelled by the client).
func (w *Watcher) finish(err error) {
	if !w.started {
		// Refused before it started: Watch returns the error.
		w.created <- errOr(err)
		return
	}
	w.err = err
	close(w.events)
}

func errOr(err error) error {
	if err == nil {
		return status.Error(codes.Canceled, "cancelled")
	}
	return err
}

// Events delivers the watch's events in revision order; it is closed when
// the watch ends (then Err says why).
func (w *Watcher) Events() <-chan *gantryv1.WatchEvent { return w.events }

// Err is the status that ended the watch once Events is closed: nil after
// Cancel.
func (w *Watcher) Err() error { return w.err }

// Cancel ends the watch; Events is closed once the store confirms it.
func (w *Watcher) Cancel() error {
	cancel := &gantryv1.WatchCancel{WatchId: w.id}
	err := w.shared.send(&gantryv1.WatchRequest{Request: &gantryv1.WatchRequest_Cancel{Cancel: cancel}})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

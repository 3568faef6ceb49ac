package gantry

import (
	"context"
	"fmt"
	"testing"
	"time"

	gantryv1 "github.com/gantry-dev/gantry/clients/go/gantry/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// next is the watcher's next event, or nil once it ended.
func next(t *testing.T, w *Watcher) *gantryv1.WatchEvent {
	select {
	case e := <-w.Events():
		return e
	case <-time.After(patience):
		t.Fatal("no event within the patience")
		return nil
	}
}

// Watches sharing one stream each get exactly their changes in order; a
// cancelled one ends with no error, a bad request is refused for that
// watch alone, and the store's end reaches every open watch.
func TestSharedWatchesEachGetTheirChangesAndEndsReachThem(t *testing.T) {
	s := startStore(t)
	client := connect(t, s)
	w := &writer{t: t, client: client}
	w.create("a")
	w.create("b")
	from := w.last()
	shared, err := OpenSharedWatch(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	watch := func(name string) *Watcher {
		watcher, err := shared.Watch(context.Background(), &gantryv1.WatchGatewaysRequest{ResourceVersion: from, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return watcher
	}
	onA, onB, onAll := watch("a"), watch("b"), watch("")
	_, err = shared.Watch(context.Background(), &gantryv1.WatchGatewaysRequest{LabelSelector: "a in ("})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a bad selector answered %v", err)
	}
	made := map[string][]int64{}
	for i := 2; i < 8; i++ {
		name := []string{"a", "b"}[i%2]
		w.update(name, i)
		made[name] = append(made[name], w.last())
		made[""] = append(made[""], w.last())
	}
	for name, watcher := range map[string]*Watcher{"a": onA, "b": onB, "": onAll} {
		var got []int64
		for len(got) < len(made[name]) {
			got = append(got, next(t, watcher).GetResourceVersion())
		}
		if fmt.Sprint(got) != fmt.Sprint(made[name]) {
			t.Fatalf("watch of %q got %v, made %v", name, got, made[name])
		}
	}

	if err := onB.Cancel(); err != nil {
		t.Fatal(err)
	}
	if e := next(t, onB); e != nil || onB.Err() != nil {
		t.Fatalf("a cancelled watch ends without an error: %v %v", e, onB.Err())
	}
	w.update("b", 9)
	if e := next(t, onAll); e.GetResourceVersion() != w.last() {
		t.Fatalf("the other watches go on: %v", e)
	}

	s.kill()
	for _, watcher := range []*Watcher{onA, onAll} {
		if e := next(t, watcher); e != nil {
			t.Fatalf("an event after the store ended: %v", e)
		}
		if watcher.Err() == nil {
			t.Fatal("the store's end reaches every open watch as an error")
		}
	}
}

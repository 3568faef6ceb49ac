//! Unit tests of fair queuing (paused time).

use super::*;

fn fairness(seats: usize, queue_length: usize) -> Fairness {
    with_byte_rate(seats, queue_length, 0)
}

fn with_byte_rate(seats: usize, queue_length: usize, viewer_bytes_per_second: u64) -> Fairness {
    let limits = FairnessLimits {
        editor_seats: seats,
        viewer_seats: seats,
        queue_length,
        queue_wait: Duration::from_secs(60),
        viewer_bytes_per_second,
    };
    Fairness::new(limits, &FairnessMetrics::default())
}

/// How long after `from` a call of `who` with `width` gets its seats.
async fn seated_after(f: &Fairness, from: Instant, width: usize) -> (Seat, Duration) {
    let seat = f.admit("next", Role::Viewer, width).await.unwrap();
    (seat, from.elapsed())
}

#[tokio::test(start_paused = true)]
async fn answers_hold_their_seats_until_the_levels_byte_rate_has_sent_them() {
    // Four seats sending 1,000 bytes a second together.
    let f = Arc::new(with_byte_rate(4, 100, 1000));
    // A page on every seat, of 500 bytes: held half a second from its
    // admission, though answered at once.
    let start = Instant::now();
    let mut page = f.admit("lister", Role::Viewer, 4).await.unwrap();
    page.charge(500);
    drop(page);
    let (seat, waited) = seated_after(&f, start, 4).await;
    assert_eq!(waited, Duration::from_millis(500));
    drop(seat);
    // One seat has a quarter of the rate: 500 bytes hold it 2 s, and
    // the other three seats stay free meanwhile.
    let start = Instant::now();
    let mut one = f.admit("getter", Role::Viewer, 1).await.unwrap();
    one.charge(500);
    drop(one);
    let (three, waited) = seated_after(&f, start, 3).await;
    assert_eq!(waited, Duration::ZERO);
    let (_all, waited) = seated_after(&f, start, 1).await;
    assert_eq!(waited, Duration::from_secs(2));
    drop(three);
    // An answer that took longer than its bytes' share is not held on.
    let mut slow = f.admit("slow", Role::Viewer, 1).await.unwrap();
    slow.charge(100);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let start = Instant::now();
    drop(slow);
    let (_seat, waited) = seated_after(&f, start, 3).await;
    assert_eq!(waited, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn without_a_byte_rate_and_on_the_editors_level_seats_are_given_back_at_once() {
    for (f, role) in
        [(with_byte_rate(1, 10, 0), Role::Viewer), (with_byte_rate(1, 10, 1), Role::Editor)]
    {
        let mut seat = f.admit("a", role, 1).await.unwrap();
        seat.charge(1_000_000);
        drop(seat);
        let start = Instant::now();
        let _next = f.admit("b", role, 1).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO, "{role:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn seats_go_round_robin_between_identities() {
    let f = Arc::new(fairness(1, 10));
    let held = f.admit("flood", Role::Viewer, 1).await.unwrap();
    // The flood queues three calls, then alice one.
    let (tx, mut order) = tokio::sync::mpsc::unbounded_channel();
    for who in ["flood", "flood", "flood", "alice"] {
        let (f, tx) = (f.clone(), tx.clone());
        tokio::spawn(async move {
            let seat = f.admit(who, Role::Viewer, 1).await.unwrap();
            tx.send(who).unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(seat);
        });
        tokio::task::yield_now().await;
    }
    drop(held);
    let mut served = Vec::new();
    for _ in 0..4 {
        served.push(order.recv().await.unwrap());
    }
    // Alice's one call is served second, not after the flood's three.
    assert_eq!(served, ["flood", "alice", "flood", "flood"]);
}

#[tokio::test(start_paused = true)]
async fn full_queues_and_long_waits_are_refused_and_other_levels_never_wait() {
    let f = Arc::new(fairness(1, 2));
    let _held = f.admit("flood", Role::Viewer, 1).await.unwrap();
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let f = f.clone();
            tokio::spawn(async move { f.admit("flood", Role::Viewer, 1).await.map(drop) })
        })
        .collect();
    tokio::task::yield_now().await;
    let refused = f.admit("flood", Role::Viewer, 1).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().contains("2 calls are queued"), "{refused:?}");
    let details = refused.get_error_details();
    assert_eq!(details.retry_info().and_then(|r| r.retry_delay), Some(RETRY_AFTER));
    // Editors, the reconciler and admins do not wait for viewers.
    let _editor = f.admit("eddie", Role::Editor, 1).await.unwrap();
    let _reconciler = f.admit("gateway-reconciler", Role::Reconciler, 1).await.unwrap();
    // A queued call waits at most the queue wait.
    for w in waiting {
        let timed_out = w.await.unwrap().unwrap_err();
        assert!(timed_out.message().contains("no seat within"), "{timed_out:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_back_before_its_retry_delay_is_held_until_it_ends() {
    let f = Arc::new(fairness(1, 0));
    let held = f.admit("flood", Role::Viewer, 1).await.unwrap();
    let refused_at = Instant::now();
    f.admit("flood", Role::Viewer, 1).await.unwrap_err();
    // Back at once: held for the delay (no seat taken), then judged
    // as any call: the seat is still taken, so refused again.
    let again = f.admit("flood", Role::Viewer, 1).await.unwrap_err();
    assert_eq!(again.code(), Code::ResourceExhausted);
    assert_eq!(refused_at.elapsed(), RETRY_AFTER, "not held for the retry delay");
    // Another identity is not held (refused at once: no seat, no queue).
    let other_at = Instant::now();
    f.admit("alice", Role::Viewer, 1).await.unwrap_err();
    assert_eq!(other_at.elapsed(), Duration::ZERO);
    // Back after the delay, with a seat free: served at once.
    drop(held);
    tokio::time::sleep(RETRY_AFTER).await;
    let back_at = Instant::now();
    let _seat = f.admit("flood", Role::Viewer, 1).await.unwrap();
    assert_eq!(back_at.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn calls_held_to_one_retry_time_are_let_go_one_by_one() {
    let f = Arc::new(fairness(1, 0));
    let _held = f.admit("flood", Role::Viewer, 1).await.unwrap();
    let refused_at = Instant::now();
    f.admit("flood", Role::Viewer, 1).await.unwrap_err();
    let back: Vec<_> = (0..10)
        .map(|_| {
            let f = f.clone();
            tokio::spawn(async move {
                let refused = f.admit("flood", Role::Viewer, 1).await.unwrap_err();
                assert_eq!(refused.code(), Code::ResourceExhausted);
                refused_at.elapsed()
            })
        })
        .collect();
    let mut judged = Vec::new();
    for call in back {
        judged.push(call.await.unwrap());
    }
    judged.sort();
    let spaced: Vec<_> = (0..10).map(|i| RETRY_AFTER + HELD_SPACING * i).collect();
    assert_eq!(judged, spaced, "not let go one per {HELD_SPACING:?}");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_gave_up_does_not_keep_the_seat() {
    let f = Arc::new(fairness(1, 10));
    let held = f.admit("a", Role::Viewer, 1).await.unwrap();
    let gave_up = {
        let f = f.clone();
        tokio::spawn(async move { f.admit("b", Role::Viewer, 1).await })
    };
    tokio::task::yield_now().await;
    gave_up.abort();
    let _ = gave_up.await;
    drop(held);
    // The seat is free again: the next call takes it at once.
    let again = tokio::time::timeout(Duration::from_millis(1), f.admit("c", Role::Viewer, 1)).await;
    assert!(again.is_ok_and(|s| s.is_ok()), "the seat was lost");
}

#[tokio::test(start_paused = true)]
async fn a_list_takes_seats_by_its_page_and_waits_for_them() {
    assert_eq!((width(None), width(Some(1)), width(Some(100)), width(Some(101))), (1, 1, 1, 2));
    let f = Arc::new(fairness(4, 10));
    // A page of 1,000 takes every seat of the level (4), not 10.
    let wide = f.admit("lister", Role::Viewer, width(Some(1000))).await.unwrap();
    let small = {
        let f = f.clone();
        tokio::spawn(async move { f.admit("other", Role::Viewer, 1).await.map(drop) })
    };
    tokio::task::yield_now().await;
    assert!(!small.is_finished(), "a call got a seat while a full-width list held them all");
    drop(wide);
    small.await.unwrap().unwrap();
    // Two pages of 200 fit beside each other; a third waits.
    let (a, b) = (
        f.admit("x", Role::Viewer, width(Some(200))).await.unwrap(),
        f.admit("y", Role::Viewer, width(Some(200))).await.unwrap(),
    );
    let third = {
        let f = f.clone();
        tokio::spawn(async move { f.admit("z", Role::Viewer, width(Some(200))).await.map(drop) })
    };
    tokio::task::yield_now().await;
    assert!(!third.is_finished());
    drop(a);
    third.await.unwrap().unwrap();
    drop(b);
}

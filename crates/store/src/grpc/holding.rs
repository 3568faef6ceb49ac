//! A response body that holds something of its call (a count of active
//! calls, a priority level's seats) until the body ends: the answer is
//! encoded and written after the handler returns, and that work belongs to
//! the call too.

use std::pin::Pin;
use std::task::{Context, Poll};

/// `body`, holding `guard` until its last frame (or until dropped).
pub struct Holding<G> {
    body: tonic::body::Body,
    guard: Option<G>,
}

impl<G: Send + Unpin + 'static> Holding<G> {
    pub fn body(body: tonic::body::Body, guard: G) -> tonic::body::Body {
        tonic::body::Body::new(Holding { body, guard: Some(guard) })
    }
}

impl<G: Unpin> http_body::Body for Holding<G> {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        let frame = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(frame, Poll::Ready(None | Some(Err(_)))) {
            self.guard = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use std::sync::Arc;

    #[tokio::test]
    async fn the_guard_is_held_until_the_last_frame() {
        let guard = Arc::new(());
        let full = http_body_util::Full::new(bytes::Bytes::from_static(b"a page"));
        let mut body = Holding::body(tonic::body::Body::new(full), guard.clone());
        let data = body.frame().await.unwrap().unwrap();
        assert_eq!(data.into_data().unwrap(), "a page");
        assert_eq!(Arc::strong_count(&guard), 2, "given back before the body ended");
        assert!(body.frame().await.is_none());
        assert_eq!(Arc::strong_count(&guard), 1, "held past the body's end");
    }
}

//! Response bodies: fixed bytes, or a file's generated content streamed in frames, with its
//! faults (reset, a stall, a flipped byte, a slow rate) applied on the way out.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use crate::Stats;
use crate::content;

/// A generated file body, with its faults.
pub(crate) struct GenBody {
    pub seed: u64,
    pub pos: u64,
    pub end: u64,
    pub reset_at: Option<u64>,
    /// From this offset on nothing more is sent, and the connection stays open.
    pub stall_at: Option<u64>,
    pub corrupt_at: Option<u64>,
    pub rate: Option<u64>,
    pub sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    pub key: String,
    pub stats: Arc<Mutex<Stats>>,
}

/// A response body: nothing, fixed bytes, or generated content.
pub(crate) enum HubBody {
    Full(Option<Bytes>),
    Gen(Box<GenBody>),
}

impl HubBody {
    pub fn empty() -> Self {
        HubBody::Full(None)
    }
    pub fn full(s: String) -> Self {
        HubBody::Full(Some(Bytes::from(s)))
    }
}

const FRAME: u64 = 256 << 10;

impl Body for HubBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            HubBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            HubBody::Gen(g) => g.poll(cx),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            HubBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            HubBody::Gen(g) => SizeHint::with_exact(g.end - g.pos),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            HubBody::Full(b) => b.is_none(),
            HubBody::Gen(g) => g.pos >= g.end,
        }
    }
}

impl GenBody {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.pos >= self.end {
            return Poll::Ready(None);
        }
        if let Some(s) = self.sleep.as_mut() {
            if s.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
        }
        if self.stall_at == Some(self.pos) {
            // No waker is kept: the body is never polled again, the client waits in vain.
            return Poll::Pending;
        }
        if self.reset_at == Some(self.pos) {
            return Poll::Ready(Some(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "injected reset",
            ))));
        }
        let mut n = FRAME.min(self.end - self.pos);
        if let Some(r) = self.reset_at {
            n = n.min(r - self.pos);
        }
        if let Some(r) = self.stall_at {
            n = n.min(r - self.pos);
        }
        if let Some(rate) = self.rate {
            // Twenty frames a second keeps the rate smooth without burning CPU.
            n = n.min((rate / 20).max(1));
            let delay = Duration::from_secs_f64(n as f64 / rate as f64);
            self.sleep = Some(Box::pin(tokio::time::sleep(delay)));
        }
        let mut buf = BytesMut::zeroed(n as usize);
        content::fill(self.seed, self.pos, &mut buf);
        if let Some(c) = self.corrupt_at
            && (self.pos..self.pos + n).contains(&c)
        {
            buf[(c - self.pos) as usize] ^= 0xFF;
        }
        self.pos += n;
        let mut s = self.stats.lock().expect("stats");
        s.bytes_served += n;
        *s.bytes_by_file.entry(self.key.clone()).or_default() += n;
        Poll::Ready(Some(Ok(Frame::data(buf.freeze()))))
    }
}

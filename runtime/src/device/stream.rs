//! Streams and events.
//!
//! A [`Stream`] is a queue of work on one device: launches and copies on it run in
//! the order they were queued. Every device has its default stream
//! ([`Device::default_stream`]), which the plain calls ([`Device::upload`],
//! `K::launch`, [`crate::Buffer::download`]) use; [`Device::stream`] makes another,
//! for work that may overlap the default stream's. A new stream is *ordered with the
//! default stream* (CUDA's and HIP's blocking streams): work on either waits for the
//! work queued before it on the other, so buffers made on the default stream are
//! ready for a kernel on any stream, and a buffer freed after a launch on any stream
//! is not reused before it finishes. Two created streams are not ordered with each
//! other: order them with [`Event`]s, or [`Stream::synchronize`].
//!
//! On the CPU and the emulator, work runs when it is queued, so every stream is
//! trivially ordered and events record the host clock.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Backend, Device};
use crate::backend::{RawEvent, RawStream};
use crate::error::Error;

/// A queue of work on a device: launches and copies on it run in the order they
/// were queued. A stream made by [`Device::stream`] is ordered with the device's
/// default stream (work on either waits for the work queued before it on the other,
/// as CUDA's and HIP's blocking streams are), not with other made streams: order
/// those with [`Event`]s or [`Stream::synchronize`]. On the CPU and the emulator,
/// work runs when it is queued. Cheap to clone; destroyed (after its work) when the
/// last clone goes.
#[derive(Clone)]
pub struct Stream {
    inner: Arc<StreamInner>,
}

struct StreamInner {
    device: Device,
    raw: RawStream,
    /// Whether it is the device's default stream (a stream made on the CPU or the
    /// emulator has the default's raw handle, but is not it).
    default: bool,
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        if let Backend::Gpu(g) = &self.device.backend {
            g.stream_destroy(self.raw);
        }
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_default() {
            write!(f, "Stream(default on {})", self.device().id())
        } else {
            write!(
                f,
                "Stream({:#x} on {})",
                self.inner.raw.0,
                self.device().id()
            )
        }
    }
}

impl Device {
    /// A new stream on this device, ordered with its default stream (see
    /// [`Stream`]). On the CPU and the emulator, a stream that runs work as it is
    /// queued.
    pub fn stream(&self) -> Result<Stream, Error> {
        let raw = match &self.backend {
            Backend::Gpu(g) => g.stream_create()?,
            Backend::Cpu | Backend::Interp | Backend::Emu(_) => RawStream::DEFAULT,
        };
        Ok(self.wrap_stream(raw, false))
    }

    /// The device's default stream (what calls without a stream use).
    pub fn default_stream(&self) -> Stream {
        self.wrap_stream(RawStream::DEFAULT, true)
    }

    fn wrap_stream(&self, raw: RawStream, default: bool) -> Stream {
        let mut device = self.clone();
        // A stream does not keep a world alive.
        device.comm = None;
        Stream {
            inner: Arc::new(StreamInner {
                device,
                raw,
                default,
            }),
        }
    }
}

impl Stream {
    /// The device it queues work on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Whether it is its device's default stream.
    pub fn is_default(&self) -> bool {
        self.inner.default
    }

    /// The backend's handle (0: the default stream).
    pub(crate) fn raw(&self) -> RawStream {
        self.inner.raw
    }

    /// The raw stream handle (`CUstream`, `hipStream_t`), for passing to other
    /// libraries. It stays valid while this stream (or a clone) lives. The default
    /// stream's is null: the *legacy* default stream (a library compiled for the
    /// per-thread default stream must be given `CU_STREAM_LEGACY` instead).
    pub fn as_raw(&self) -> *mut std::ffi::c_void {
        self.inner.raw.0 as usize as *mut std::ffi::c_void
    }

    /// Waits until everything queued on it has finished.
    pub fn synchronize(&self) -> Result<(), Error> {
        match &self.device().backend {
            Backend::Gpu(g) => g.synchronize(self.raw()),
            Backend::Cpu | Backend::Interp | Backend::Emu(_) => Ok(()),
        }
    }

    /// Records a new event on this stream: it completes when the work queued before
    /// it does.
    pub fn record(&self) -> Result<Event, Error> {
        let e = Event::new(self.device())?;
        e.record(self)?;
        Ok(e)
    }
}

/// A point in a stream's work: [`Event::record`] it on a stream, wait for it with
/// [`Event::synchronize`], and time the work between two with [`Event::elapsed`].
pub struct Event {
    device: Device,
    raw: Option<RawEvent>,
    /// CPU and emulator: when it was recorded.
    at: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event(on {})", self.device.id())
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let (Backend::Gpu(g), Some(e)) = (&self.device.backend, self.raw) {
            g.event_destroy(e);
        }
    }
}

impl Event {
    /// A new, unrecorded event on `device`.
    pub fn new(device: &Device) -> Result<Event, Error> {
        let raw = match &device.backend {
            Backend::Gpu(g) => Some(g.event_create()?),
            Backend::Cpu | Backend::Interp | Backend::Emu(_) => None,
        };
        let mut device = device.clone();
        device.comm = None;
        Ok(Event {
            device,
            raw,
            at: Mutex::new(None),
        })
    }

    /// Records it on `stream` (of the same device), replacing an earlier record.
    pub fn record(&self, stream: &Stream) -> Result<(), Error> {
        if stream.device() != &self.device {
            return Err(Error::Usage(format!(
                "recording an event of {} on a stream of {}",
                self.device.id(),
                stream.device().id()
            )));
        }
        self.record_raw(stream.raw())
    }

    pub(crate) fn record_raw(&self, stream: RawStream) -> Result<(), Error> {
        match (&self.device.backend, self.raw) {
            (Backend::Gpu(g), Some(e)) => g.event_record(e, stream),
            _ => {
                *self.at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                Ok(())
            }
        }
    }

    /// Waits until the work queued before its record has finished.
    pub fn synchronize(&self) -> Result<(), Error> {
        match (&self.device.backend, self.raw) {
            (Backend::Gpu(g), Some(e)) => g.event_synchronize(e),
            _ => Ok(()),
        }
    }

    /// The device time from `start`'s record to this event's (waits for this one).
    /// Both must be recorded, on the same device.
    pub fn elapsed_since(&self, start: &Event) -> Result<Duration, Error> {
        if start.device != self.device {
            return Err(Error::Usage(format!(
                "timing between events of {} and {}",
                start.device.id(),
                self.device.id()
            )));
        }
        match (&self.device.backend, start.raw, self.raw) {
            (Backend::Gpu(g), Some(a), Some(b)) => {
                g.event_synchronize(b)?;
                g.event_elapsed(a, b)
            }
            _ => {
                let at = |e: &Event| *e.at.lock().unwrap_or_else(|p| p.into_inner());
                match (at(start), at(self)) {
                    (Some(a), Some(b)) => Ok(b.saturating_duration_since(a)),
                    _ => Err(Error::Usage(
                        "timing an event that was never recorded".into(),
                    )),
                }
            }
        }
    }

    /// The device time from this event's record to `end`'s (waits for `end`).
    pub fn elapsed(&self, end: &Event) -> Result<Duration, Error> {
        end.elapsed_since(self)
    }
}

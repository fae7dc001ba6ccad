//! The few calls of the CUDA driver API that staging into device memory needs, loaded when the
//! case runs (`libcuda.so.1`, which the NVIDIA driver installs) rather than linked, so the bench
//! builds and runs on machines without a GPU, where that case says it skipped.
//!
//! Everything runs on one stream of the first device's primary context, made current on the
//! thread that loads the driver; the case calls the driver from that thread only.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::Arc;

use libloading::Library;
use weightbay::{AccessPolicy, AllocationController, AllocationProperty, Error, Result};

type CuResult = c_int;
type Handle = *mut c_void;
type DevicePtr = u64;

/// `CUDA_ERROR_NOT_READY`: an event's work has not finished.
const NOT_READY: CuResult = 600;
/// `CU_STREAM_NON_BLOCKING`: the stream does not wait for the legacy default stream.
const STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_EVENT_DISABLE_TIMING`: events only order work, which makes them cheaper.
const EVENT_DISABLE_TIMING: c_uint = 2;

/// The driver's entry points, copied out of the library, which [`Cuda`] keeps loaded.
struct Entries {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult,
    device_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult,
    primary_context: unsafe extern "C" fn(*mut Handle, c_int) -> CuResult,
    set_current: unsafe extern "C" fn(Handle) -> CuResult,
    stream_create: unsafe extern "C" fn(*mut Handle, c_uint) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(Handle) -> CuResult,
    alloc: unsafe extern "C" fn(*mut DevicePtr, usize) -> CuResult,
    free: unsafe extern "C" fn(DevicePtr) -> CuResult,
    host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult,
    host_free: unsafe extern "C" fn(*mut c_void) -> CuResult,
    copy_to_device_async: unsafe extern "C" fn(DevicePtr, *const c_void, usize, Handle) -> CuResult,
    copy_to_device: unsafe extern "C" fn(DevicePtr, *const c_void, usize) -> CuResult,
    copy_to_host: unsafe extern "C" fn(*mut c_void, DevicePtr, usize) -> CuResult,
    event_create: unsafe extern "C" fn(*mut Handle, c_uint) -> CuResult,
    event_record: unsafe extern "C" fn(Handle, Handle) -> CuResult,
    event_query: unsafe extern "C" fn(Handle) -> CuResult,
    event_synchronize: unsafe extern "C" fn(Handle) -> CuResult,
    event_destroy: unsafe extern "C" fn(Handle) -> CuResult,
    error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
}

/// The driver, the first device's primary context and one stream on it.
pub(crate) struct Cuda {
    entries: Entries,
    stream: Handle,
    name: String,
    /// Keeps the entry points valid; dropped last.
    _library: Library,
}

// SAFETY: the handles are the driver's, which it allows to be used from any thread; the case
// calls the driver from the thread that made the context current.
unsafe impl Send for Cuda {}
// SAFETY: as above; `Cuda` has no interior mutability of its own.
unsafe impl Sync for Cuda {}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda").field("device", &self.name).finish()
    }
}

/// One entry point by name, or why it is missing.
fn entry<T: Copy>(library: &Library, name: &str) -> std::result::Result<T, String> {
    // SAFETY: every caller names a driver API function whose C signature is `T`, as declared
    // in cuda.h for that (versioned) name.
    unsafe { library.get::<T>(name.as_bytes()) }
        .map(|symbol| *symbol)
        .map_err(|e| format!("libcuda.so.1 has no {name}: {e}"))
}

impl Cuda {
    /// Loads the driver and makes the first device's primary context current on this thread.
    ///
    /// # Errors
    /// Why no device can be used (no driver installed, no device), as text: the case prints it
    /// as the reason it skipped.
    pub(crate) fn load() -> std::result::Result<Self, String> {
        // SAFETY: loading the NVIDIA driver library runs its initializers, which have no
        // preconditions on the process.
        let library = unsafe { Library::new("libcuda.so.1") }
            .map_err(|e| format!("no CUDA driver here (libcuda.so.1: {e})"))?;
        let entries = Entries {
            init: entry(&library, "cuInit")?,
            device_get: entry(&library, "cuDeviceGet")?,
            device_name: entry(&library, "cuDeviceGetName")?,
            primary_context: entry(&library, "cuDevicePrimaryCtxRetain")?,
            set_current: entry(&library, "cuCtxSetCurrent")?,
            stream_create: entry(&library, "cuStreamCreate")?,
            stream_synchronize: entry(&library, "cuStreamSynchronize")?,
            alloc: entry(&library, "cuMemAlloc_v2")?,
            free: entry(&library, "cuMemFree_v2")?,
            host_alloc: entry(&library, "cuMemHostAlloc")?,
            host_free: entry(&library, "cuMemFreeHost")?,
            copy_to_device_async: entry(&library, "cuMemcpyHtoDAsync_v2")?,
            copy_to_device: entry(&library, "cuMemcpyHtoD_v2")?,
            copy_to_host: entry(&library, "cuMemcpyDtoH_v2")?,
            event_create: entry(&library, "cuEventCreate")?,
            event_record: entry(&library, "cuEventRecord")?,
            event_query: entry(&library, "cuEventQuery")?,
            event_synchronize: entry(&library, "cuEventSynchronize")?,
            event_destroy: entry(&library, "cuEventDestroy_v2")?,
            error_name: entry(&library, "cuGetErrorName")?,
        };
        let mut cuda = Self {
            entries,
            stream: std::ptr::null_mut(),
            name: String::new(),
            _library: library,
        };
        let failed = |e: Error| e.to_string();
        // SAFETY: cuInit takes flags, which must be 0.
        cuda.check("cuInit", unsafe { (cuda.entries.init)(0) })
            .map_err(failed)?;
        let mut device = 0;
        // SAFETY: `device` is a valid place for the device handle.
        cuda.check("cuDeviceGet", unsafe {
            (cuda.entries.device_get)(&mut device, 0)
        })
        .map_err(failed)?;
        let mut name = [0 as c_char; 128];
        // SAFETY: the driver writes at most `name.len()` bytes, NUL-terminated, into `name`.
        cuda.check("cuDeviceGetName", unsafe {
            (cuda.entries.device_name)(name.as_mut_ptr(), name.len() as c_int, device)
        })
        .map_err(failed)?;
        // SAFETY: NUL-terminated by the call above.
        cuda.name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut context = std::ptr::null_mut();
        // SAFETY: `context` is a valid place for the context handle of a device just named.
        cuda.check("cuDevicePrimaryCtxRetain", unsafe {
            (cuda.entries.primary_context)(&mut context, device)
        })
        .map_err(failed)?;
        // SAFETY: a context the driver just handed out.
        cuda.check("cuCtxSetCurrent", unsafe {
            (cuda.entries.set_current)(context)
        })
        .map_err(failed)?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: `stream` is a valid place for the handle; a context is current.
        cuda.check("cuStreamCreate", unsafe {
            (cuda.entries.stream_create)(&mut stream, STREAM_NON_BLOCKING)
        })
        .map_err(failed)?;
        cuda.stream = stream;
        Ok(cuda)
    }

    /// The device's name, as the driver gives it.
    pub(crate) fn device_name(&self) -> &str {
        &self.name
    }

    /// `result` as an error naming the call and the driver's error name.
    fn check(&self, call: &str, result: CuResult) -> Result<()> {
        if result == 0 {
            return Ok(());
        }
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: `name` is a valid place for a pointer to a static string.
        let known = unsafe { (self.entries.error_name)(result, &mut name) } == 0 && !name.is_null();
        let name = if known {
            // SAFETY: the driver returned a static NUL-terminated string.
            unsafe { std::ffi::CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        } else {
            format!("error {result}")
        };
        Err(Error::new(
            weightbay::ErrorKind::Io,
            format!("CUDA {call} failed: {name}"),
        ))
    }

    /// `len` bytes of device memory.
    pub(crate) fn device_memory(self: &Arc<Self>, len: usize) -> Result<DeviceMemory> {
        let mut ptr = 0;
        // SAFETY: `ptr` is a valid place for the device address; a context is current.
        self.check("cuMemAlloc", unsafe { (self.entries.alloc)(&mut ptr, len) })?;
        Ok(DeviceMemory {
            cuda: Arc::clone(self),
            ptr,
            len,
        })
    }

    /// `len` bytes of page-locked host memory, which the device reads without a bounce copy.
    pub(crate) fn pinned(self: &Arc<Self>, len: usize) -> Result<PinnedBuffer> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid place for the host address; flags 0 is plain pinned memory.
        self.check("cuMemHostAlloc", unsafe {
            (self.entries.host_alloc)(&mut ptr, len, 0)
        })?;
        Ok(PinnedBuffer {
            cuda: Arc::clone(self),
            ptr: ptr.cast(),
            len,
        })
    }

    /// Queues a copy of `from` to `to` bytes into `memory` on the stream. `from` must stay in
    /// place and unchanged until the stream has passed the copy: pinned memory is read by the
    /// device after this returns (pageable memory is copied before it returns).
    pub(crate) fn copy_async(&self, memory: &DeviceMemory, to: u64, from: &[u8]) -> Result<()> {
        memory.check_range(to, from.len())?;
        // SAFETY: the range lies within the allocation (checked above), and the caller keeps
        // `from` alive until the stream passes the copy (see above).
        self.check("cuMemcpyHtoDAsync", unsafe {
            (self.entries.copy_to_device_async)(
                memory.ptr + to,
                from.as_ptr().cast(),
                from.len(),
                self.stream,
            )
        })
    }

    /// Copies `from` into `memory` at `to` and returns once the device has it.
    pub(crate) fn copy(&self, memory: &DeviceMemory, to: u64, from: &[u8]) -> Result<()> {
        memory.check_range(to, from.len())?;
        // SAFETY: the range lies within the allocation (checked above); the call is synchronous.
        self.check("cuMemcpyHtoD", unsafe {
            (self.entries.copy_to_device)(memory.ptr + to, from.as_ptr().cast(), from.len())
        })
    }

    /// Copies `into.len()` bytes of `memory` from `from` back to the host.
    pub(crate) fn copy_back(
        &self,
        memory: &DeviceMemory,
        from: u64,
        into: &mut [u8],
    ) -> Result<()> {
        memory.check_range(from, into.len())?;
        // SAFETY: the range lies within the allocation (checked above); the call is synchronous.
        self.check("cuMemcpyDtoH", unsafe {
            (self.entries.copy_to_host)(into.as_mut_ptr().cast(), memory.ptr + from, into.len())
        })
    }

    /// An event that completes once the stream has passed everything queued before it.
    pub(crate) fn record(self: &Arc<Self>) -> Result<Event> {
        let mut handle = std::ptr::null_mut();
        // SAFETY: `handle` is a valid place for the event handle.
        self.check("cuEventCreate", unsafe {
            (self.entries.event_create)(&mut handle, EVENT_DISABLE_TIMING)
        })?;
        let event = Event {
            cuda: Arc::clone(self),
            handle,
        };
        // SAFETY: an event and the stream, both this context's.
        self.check("cuEventRecord", unsafe {
            (self.entries.event_record)(handle, self.stream)
        })?;
        Ok(event)
    }

    /// Waits until the stream has passed everything queued on it.
    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream this context made.
        self.check("cuStreamSynchronize", unsafe {
            (self.entries.stream_synchronize)(self.stream)
        })
    }
}

/// A device allocation, freed when dropped.
#[derive(Debug)]
pub(crate) struct DeviceMemory {
    cuda: Arc<Cuda>,
    ptr: DevicePtr,
    len: usize,
}

impl DeviceMemory {
    fn check_range(&self, at: u64, len: usize) -> Result<()> {
        match at.checked_add(len as u64) {
            Some(end) if end <= self.len as u64 => Ok(()),
            _ => Err(Error::invalid(format!(
                "{len} bytes at {at} do not fit a device allocation of {} bytes",
                self.len
            ))),
        }
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: an allocation of this context; no copy into it is pending once its owner
        // drops it (the case synchronizes the stream first).
        unsafe { (self.cuda.entries.free)(self.ptr) };
    }
}

/// A point in the stream, to wait for.
#[derive(Debug)]
pub(crate) struct Event {
    cuda: Arc<Cuda>,
    handle: Handle,
}

impl Event {
    /// Whether the stream has passed the event.
    pub(crate) fn done(&self) -> Result<bool> {
        // SAFETY: an event of this context.
        match unsafe { (self.cuda.entries.event_query)(self.handle) } {
            NOT_READY => Ok(false),
            result => self.cuda.check("cuEventQuery", result).map(|()| true),
        }
    }

    /// Waits for the stream to pass the event.
    pub(crate) fn wait(&self) -> Result<()> {
        // SAFETY: an event of this context.
        self.cuda.check("cuEventSynchronize", unsafe {
            (self.cuda.entries.event_synchronize)(self.handle)
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: an event of this context; the driver frees it once the stream passes it.
        unsafe { (self.cuda.entries.event_destroy)(self.handle) };
    }
}

/// A page-locked host buffer from `cuMemHostAlloc`, lent to a [`weightbay::StagingPool`] as
/// [`AllocationProperty::Pinned`] memory: the shape a CUDA runtime's own pool takes.
#[derive(Debug)]
pub(crate) struct PinnedBuffer {
    cuda: Arc<Cuda>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain host memory owned by this value alone.
unsafe impl Send for PinnedBuffer {}
// SAFETY: shared access only reads it.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    fn slice(&self) -> &[u8] {
        // SAFETY: `len` bytes at `ptr` are this value's for as long as it lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl AllocationController for PinnedBuffer {
    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn alignment(&self) -> usize {
        // The driver hands out whole pages.
        4096
    }

    fn property(&self) -> AllocationProperty {
        AllocationProperty::Pinned
    }

    fn memory(&self, _policy: AccessPolicy) -> Result<&[u8]> {
        Ok(self.slice())
    }

    fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        let from = self
            .slice()
            .get(offset..offset + buf.len())
            .ok_or_else(|| Error::invalid("a read past the end of a pinned buffer"))?;
        buf.copy_from_slice(from);
        Ok(())
    }

    fn narrow(&self, _start: usize, _end: usize) -> Option<Box<dyn AllocationController>> {
        None
    }

    fn memory_mut(&mut self) -> Option<&mut [u8]> {
        // SAFETY: `len` bytes at `ptr` are this value's, and `&mut self` makes the access
        // exclusive.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }

    fn retain(&self, _start: usize, _end: usize) -> Option<weightbay::SharedBytes> {
        None
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: memory from cuMemHostAlloc; the case synchronizes the stream before a pool
        // (and so its buffers) is dropped, so no copy still reads it.
        unsafe { (self.cuda.entries.host_free)(self.ptr.cast()) };
    }
}

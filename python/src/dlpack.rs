//! DLPack, the tensor exchange torch, numpy and JAX share (`__dlpack__` / `from_dlpack`): the
//! tensors a save takes are read where they lie, a read in place fills the caller's tensors,
//! and the tensors a load gives view memory weightbay owns (a buffer each tensor landed in, or
//! the pages of a private memory map), so no direction copies.
//!
//! The structs are DLPack 0.8's ABI (`dlpack.h`), the unversioned capsule `dltensor` every
//! producer and consumer speaks. Float8 codes are DLPack 1.1's.

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use weightbay::{AccessPolicy, AllocationProperty, BoolStore, Bytes, DType, SharedBytes};

const CAPSULE_NAME: &CStr = c"dltensor";
const USED_CAPSULE_NAME: &CStr = c"used_dltensor";

/// `kDLCPU`: host memory.
const DEVICE_CPU: i32 = 1;
/// `kDLCUDAHost`: page-locked host memory, readable by the CPU.
const DEVICE_CUDA_HOST: i32 = 3;

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

const fn dl(code: u8, bits: u8) -> DLDataType {
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

/// Each stored dtype and its DLPack type (codes: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool,
/// 10 float8_e4m3fn, 12 float8_e5m2). The first entry of a DLPack type is the dtype a tensor
/// of that type is saved as.
const DTYPES: &[(DType, DLDataType)] = &[
    (DType::F64, dl(2, 64)),
    (DType::F32, dl(2, 32)),
    (DType::F16, dl(2, 16)),
    (DType::BF16, dl(4, 16)),
    (DType::I64, dl(0, 64)),
    (DType::I32, dl(0, 32)),
    (DType::I16, dl(0, 16)),
    (DType::I8, dl(0, 8)),
    (DType::U64, dl(1, 64)),
    (DType::U32, dl(1, 32)),
    (DType::U16, dl(1, 16)),
    (DType::U8, dl(1, 8)),
    (DType::Bool(BoolStore::Native), dl(6, 8)),
    (DType::F8E4M3, dl(10, 8)),
    (DType::F8E5M2, dl(12, 8)),
    // Read only: burn's dtypes, given as the type their bytes hold.
    (DType::Flex32, dl(2, 32)),
    (DType::Bool(BoolStore::U8), dl(6, 8)),
    (DType::Bool(BoolStore::U32), dl(1, 32)),
];

/// The DLPack type a stored dtype is given as; `None` for a quantized tensor.
pub(crate) fn dlpack_type(dtype: &DType) -> Option<DLDataType> {
    DTYPES.iter().find(|(d, _)| d == dtype).map(|&(_, t)| t)
}

/// A tensor a caller passed, read where it lies: its stored dtype, shape and bytes. The bytes
/// own the producer's DLPack tensor and release it when the last handle to them drops.
pub(crate) struct ImportedTensor {
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<u64>,
    pub(crate) bytes: Bytes,
}

/// Takes `object`'s memory through `__dlpack__()`, to be read: see [`consume`].
pub(crate) fn import(name: &str, object: &Bound<'_, PyAny>) -> PyResult<ImportedTensor> {
    let (dtype, shape, memory) = consume(name, object)?;
    Ok(ImportedTensor {
        dtype,
        shape,
        bytes: Bytes::from_shared(SharedBytes::from_owner(memory), AllocationProperty::Shared),
    })
}

/// A tensor a caller passed to be filled in place: its stored dtype, shape and memory.
pub(crate) struct TargetTensor {
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<u64>,
    memory: Consumed,
}

impl TargetTensor {
    /// Where the tensor's bytes start, to tell targets that share memory apart.
    pub(crate) fn address(&self) -> usize {
        self.memory.data as usize
    }

    /// The tensor's bytes, to be written.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `data` addresses `len` bytes of the producer's tensor (a dangling, aligned
        // pointer for none), alive until the memory drops; `&mut self` makes this the only
        // slice of it weightbay holds, and the caller refuses targets whose memory overlaps.
        // The tensor's other Python views are the caller's to leave alone while the read runs
        // (documented on the read).
        unsafe { std::slice::from_raw_parts_mut(self.memory.data.cast_mut(), self.memory.len) }
    }
}

/// Takes `object`'s memory through `__dlpack__()`, to be written in place: as [`consume`].
pub(crate) fn import_target(name: &str, object: &Bound<'_, PyAny>) -> PyResult<TargetTensor> {
    let (dtype, shape, memory) = consume(name, object)?;
    Ok(TargetTensor {
        dtype,
        shape,
        memory,
    })
}

/// Consumes `object`'s DLPack capsule, checked before anything is consumed: host memory, a
/// dtype the containers store, a compact row-major layout. Every error names `name`.
fn consume(name: &str, object: &Bound<'_, PyAny>) -> PyResult<(DType, Vec<u64>, Consumed)> {
    let refuse = |what: String| PyValueError::new_err(format!("tensor `{name}`: {what}"));
    if !object.hasattr("__dlpack__")? {
        return Err(PyTypeError::new_err(format!(
            "tensor `{name}`: a {} is not a tensor (it has no `__dlpack__`)",
            object.get_type().name()?
        )));
    }
    let capsule = object.call_method0("__dlpack__")?;
    let capsule = capsule.cast_into::<PyCapsule>().map_err(|_| {
        PyTypeError::new_err(format!("tensor `{name}`: `__dlpack__` gave no capsule"))
    })?;
    let managed = capsule
        .pointer_checked(Some(CAPSULE_NAME))?
        .cast::<DLManagedTensor>();
    // SAFETY: a `dltensor` capsule holds a `DLManagedTensor` that stays valid while the
    // capsule is unconsumed; we only read it here.
    let tensor = unsafe { &managed.as_ref().dl_tensor };
    if !matches!(tensor.device.device_type, DEVICE_CPU | DEVICE_CUDA_HOST) {
        return Err(refuse(format!(
            "it is in device memory (DLPack device type {}); weightbay reads host memory: \
             move it there first (`.cpu()` in torch)",
            tensor.device.device_type
        )));
    }
    let dtype = DTYPES
        .iter()
        .find(|(_, t)| *t == tensor.dtype)
        .map(|(d, _)| d.clone())
        .ok_or_else(|| {
            refuse(format!(
                "{} has no stored equivalent",
                describe(tensor.dtype)
            ))
        })?;
    let shape = dims(tensor).map_err(&refuse)?;
    let element_len = u64::from(tensor.dtype.bits / 8);
    let len = shape
        .iter()
        .try_fold(element_len, |len, &dim| len.checked_mul(dim))
        .and_then(|len| usize::try_from(len).ok())
        .ok_or_else(|| refuse(format!("its shape {shape:?} is too large")))?;
    check_compact(tensor, &shape).map_err(&refuse)?;
    let data = if len == 0 {
        NonNull::<u8>::dangling().as_ptr().cast_const()
    } else {
        // `byte_offset` is within the producer's allocation by the DLPack contract.
        tensor
            .data
            .cast::<u8>()
            .cast_const()
            .wrapping_add(tensor.byte_offset as usize)
    };
    // SAFETY: renaming a valid capsule to `used_dltensor` marks it consumed (the DLPack
    // protocol): from here the deleter is ours to call, which `Consumed` does on drop.
    let renamed =
        unsafe { pyo3::ffi::PyCapsule_SetName(capsule.as_ptr(), USED_CAPSULE_NAME.as_ptr()) };
    if renamed != 0 {
        return Err(PyErr::fetch(object.py()));
    }
    Ok((dtype, shape, Consumed { managed, data, len }))
}

/// The dimensions of `tensor`, each checked to be non-negative.
fn dims(tensor: &DLTensor) -> Result<Vec<u64>, String> {
    let ndim = usize::try_from(tensor.ndim).map_err(|_| format!("ndim {}", tensor.ndim))?;
    if ndim == 0 {
        return Ok(Vec::new());
    }
    if tensor.shape.is_null() {
        return Err("its DLPack shape is missing".to_owned());
    }
    // SAFETY: a DLPack tensor's `shape` points to `ndim` dimensions.
    let shape = unsafe { std::slice::from_raw_parts(tensor.shape, ndim) };
    shape
        .iter()
        .map(|&dim| u64::try_from(dim).map_err(|_| format!("a negative dimension {dim}")))
        .collect()
}

/// Refuses a tensor whose elements are not back to back in row-major order (a transposed or
/// sliced view): its bytes are not the container's layout.
fn check_compact(tensor: &DLTensor, shape: &[u64]) -> Result<(), String> {
    if tensor.strides.is_null() || shape.contains(&0) {
        return Ok(());
    }
    // SAFETY: non-null strides point to `ndim` entries, as many as `shape` has.
    let strides = unsafe { std::slice::from_raw_parts(tensor.strides, shape.len()) };
    let mut expected: i64 = 1;
    for (&dim, &stride) in shape.iter().zip(strides).rev() {
        if dim != 1 && stride != expected {
            return Err(format!(
                "its elements are not contiguous (strides {strides:?} for shape {shape:?}): \
                 pass a contiguous copy"
            ));
        }
        expected = expected.saturating_mul(dim as i64);
    }
    Ok(())
}

fn describe(t: DLDataType) -> String {
    let kind = match t.code {
        0 => "int",
        1 => "uint",
        2 => "float",
        3 => "opaque handle",
        4 => "bfloat",
        5 => "complex",
        6 => "bool",
        7..=14 => "float8",
        _ => "DLPack type",
    };
    match t.lanes {
        1 => format!("{kind}{} (DLPack code {})", t.bits, t.code),
        lanes => format!("{kind}{}x{lanes} (DLPack code {})", t.bits, t.code),
    }
}

/// A consumed DLPack tensor's memory, released through its producer's deleter.
struct Consumed {
    managed: NonNull<DLManagedTensor>,
    data: *const u8,
    len: usize,
}

// SAFETY: the memory is plain host bytes the producer keeps alive until its deleter runs, and
// DLPack deleters may be called from any thread (producers that need the GIL take it).
unsafe impl Send for Consumed {}

impl AsRef<[u8]> for Consumed {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `data` addresses `len` bytes of the producer's tensor, alive until drop;
        // a zero length uses a dangling, aligned pointer.
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }
}

impl Drop for Consumed {
    fn drop(&mut self) {
        // SAFETY: the tensor was consumed once, so its deleter runs exactly once, here.
        unsafe {
            if let Some(deleter) = self.managed.as_ref().deleter {
                deleter(self.managed.as_ptr());
            }
        }
    }
}

/// A tensor weightbay loaded, given to torch, numpy or JAX through `from_dlpack` without a
/// copy: its memory is a buffer of its own, or the pages of a private memory map, which a
/// change in place copies for this process and never writes to the file.
#[pyclass(frozen, module = "weightbay._native")]
pub(crate) struct HostTensor {
    bytes: Bytes,
    dtype: DLDataType,
    shape: Vec<i64>,
}

impl HostTensor {
    /// Wraps `bytes`, whose length must be `shape`'s elements of `dtype`.
    pub(crate) fn new(bytes: Bytes, dtype: DLDataType, shape: &[u64]) -> PyResult<Self> {
        let shape = shape
            .iter()
            .map(|&dim| i64::try_from(dim))
            .collect::<Result<_, _>>()
            .map_err(|_| PyValueError::new_err(format!("a shape {shape:?} DLPack cannot hold")))?;
        Ok(Self {
            bytes,
            dtype,
            shape,
        })
    }
}

/// What a `HostTensor`'s capsule owns: the DLPack struct consumers hold a pointer to (first,
/// so that pointer is this box's), the shape it points to, and the bytes kept alive.
#[repr(C)]
struct Exported {
    managed: DLManagedTensor,
    shape: Vec<i64>,
    _bytes: Bytes,
}

unsafe extern "C" fn delete_exported(managed: *mut DLManagedTensor) {
    // SAFETY: `managed` is the first field of a boxed `Exported` whose address is in
    // `manager_ctx`; DLPack calls the deleter once.
    unsafe { drop(Box::from_raw((*managed).manager_ctx.cast::<Exported>())) };
}

unsafe extern "C" fn drop_unconsumed_capsule(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: called by Python with a capsule this module made. One still named `dltensor`
    // was never consumed, so its tensor is ours to delete; a consumer renamed the others.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, CAPSULE_NAME.as_ptr()) == 1 {
            let managed = pyo3::ffi::PyCapsule_GetPointer(capsule, CAPSULE_NAME.as_ptr());
            delete_exported(managed.cast());
        }
    }
}

#[pymethods]
impl HostTensor {
    /// The DLPack capsule `from_dlpack` consumes. Host memory only (`dl_device` must be the
    /// CPU); `copy=True` hands out a copy.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // Host memory has no stream to order against, and this capsule is DLPack 0.8's,
        // which every consumer asking for a newer version also takes.
        let _ = (stream, max_version);
        if let Some(device) = dl_device.filter(|&d| d != (DEVICE_CPU, 0)) {
            return Err(PyBufferError::new_err(format!(
                "a weightbay tensor is in host memory and cannot be handed to device {device:?}"
            )));
        }
        let bytes = if copy == Some(true) {
            let view = self
                .bytes
                .read(AccessPolicy::AllowCopy)
                .map_err(crate::errors::to_py)?;
            Bytes::copy_from_slice(view, 64).map_err(crate::errors::to_py)?
        } else {
            self.bytes.clone()
        };
        let data = bytes
            .read(AccessPolicy::ZeroCopy)
            .map_err(crate::errors::to_py)?
            .as_ptr()
            .cast_mut();
        let mut exported = Box::new(Exported {
            managed: DLManagedTensor {
                dl_tensor: DLTensor {
                    data: data.cast(),
                    device: DLDevice {
                        device_type: DEVICE_CPU,
                        device_id: 0,
                    },
                    ndim: self.shape.len() as i32,
                    dtype: self.dtype,
                    shape: std::ptr::null_mut(),
                    // Null: compact row-major.
                    strides: std::ptr::null_mut(),
                    byte_offset: 0,
                },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_exported),
            },
            shape: self.shape.clone(),
            _bytes: bytes,
        });
        exported.managed.dl_tensor.shape = exported.shape.as_mut_ptr();
        let raw = Box::into_raw(exported);
        // SAFETY: `raw` is a live box; its first field is the DLManagedTensor.
        unsafe { (*raw).managed.manager_ctx = raw.cast() };
        let pointer = NonNull::new(raw.cast::<c_void>()).expect("a box is never null");
        // SAFETY: the pointer is the boxed DLManagedTensor, freed by its deleter, which either
        // the consumer or the capsule's destructor (when unconsumed) calls once.
        let capsule = unsafe {
            PyCapsule::new_with_pointer_and_destructor(
                py,
                pointer,
                CAPSULE_NAME,
                Some(drop_unconsumed_capsule),
            )
        };
        if capsule.is_err() {
            // SAFETY: no capsule owns the box, so it is freed here, once.
            unsafe { delete_exported(raw.cast()) };
        }
        capsule
    }

    /// `(kDLCPU, 0)`: host memory.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (DEVICE_CPU, 0)
    }
}

//! A tensor to write: resident bytes, or a provider that produces them when the writer gets
//! to it.

use std::fmt;
use std::sync::Arc;

use crate::dtype::Element;
use crate::{Bytes, DType, Result};

/// Produces a deferred tensor's bytes. Called once per write, in write order.
type Provider = Arc<dyn Fn() -> Result<Bytes> + Send + Sync>;

#[derive(Clone)]
enum Data {
    Resident(Bytes),
    Deferred { len: u64, provider: Provider },
}

/// A named tensor: dtype, shape, optional parameter id, and its bytes (raw little-endian
/// elements) either resident or deferred.
///
/// ```
/// use weightbay::{Bytes, DType, Tensor};
/// let bias = Tensor::new("layer.bias", DType::F32, [2], 1.5f32.to_le_bytes().repeat(2));
/// let weight = Tensor::deferred("layer.weight", DType::F16, [1024, 1024], 2 << 20, || {
///     Ok(Bytes::from(vec![0u8; 2 << 20])) // e.g. read back from a device
/// });
/// assert_eq!(weight.byte_len(), 2 << 20);
/// assert!(!bias.is_deferred());
/// ```
#[derive(Clone)]
pub struct Tensor {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    param_id: Option<u64>,
    data: Data,
}

impl Tensor {
    /// A tensor whose bytes are already in memory.
    pub fn new(
        name: impl Into<String>,
        dtype: DType,
        shape: impl Into<Vec<u64>>,
        bytes: impl Into<Bytes>,
    ) -> Self {
        Self {
            name: name.into(),
            dtype,
            shape: shape.into(),
            param_id: None,
            data: Data::Resident(bytes.into()),
        }
    }

    /// A tensor of plain numbers, copied from `data` in their little-endian encoding.
    ///
    /// ```
    /// use weightbay::{MemoryStorage, Reader, Tensor, Writer};
    /// let storage = MemoryStorage::new();
    /// Writer::new(vec![Tensor::from_slice("w", [2, 2], &[1.0f32, 2.0, 3.0, 4.0])])
    ///     .write_to(&storage, "model.bpk")?;
    /// let reader = Reader::open_key(&storage, "model.bpk")?;
    /// assert_eq!(reader.read_as::<f32>("w")?, [1.0, 2.0, 3.0, 4.0]);
    /// # Ok::<(), weightbay::Error>(())
    /// ```
    pub fn from_slice<T: Element>(
        name: impl Into<String>,
        shape: impl Into<Vec<u64>>,
        data: &[T],
    ) -> Self {
        let mut bytes = Vec::with_capacity(std::mem::size_of_val(data));
        for &element in data {
            element.put_le(&mut bytes);
        }
        Self::new(name, T::DTYPE, shape, bytes)
    }

    /// A tensor whose `byte_len` bytes `provider` produces when the writer reaches it. The
    /// writer drops them before it calls the next provider, so peak memory stays at about one
    /// tensor.
    pub fn deferred(
        name: impl Into<String>,
        dtype: DType,
        shape: impl Into<Vec<u64>>,
        byte_len: u64,
        provider: impl Fn() -> Result<Bytes> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name: name.into(),
            dtype,
            shape: shape.into(),
            param_id: None,
            data: Data::Deferred {
                len: byte_len,
                provider: Arc::new(provider),
            },
        }
    }

    /// Sets the parameter id (burn's training-state identity).
    #[must_use]
    pub fn with_param_id(mut self, param_id: u64) -> Self {
        self.param_id = Some(param_id);
        self
    }

    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The element type.
    pub fn dtype(&self) -> &DType {
        &self.dtype
    }

    /// The dimensions; empty for a scalar tensor.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// The parameter id, if any.
    pub fn param_id(&self) -> Option<u64> {
        self.param_id
    }

    /// The byte length: resident bytes' length, or the length declared for a deferred tensor.
    pub fn byte_len(&self) -> u64 {
        match &self.data {
            Data::Resident(bytes) => bytes.len() as u64,
            Data::Deferred { len, .. } => *len,
        }
    }

    /// Whether the bytes come from a provider.
    pub fn is_deferred(&self) -> bool {
        matches!(self.data, Data::Deferred { .. })
    }

    /// The bytes: a cheap clone of resident bytes, or a fresh call of the provider.
    ///
    /// # Errors
    /// The provider's error.
    pub fn bytes(&self) -> Result<Bytes> {
        match &self.data {
            Data::Resident(bytes) => Ok(bytes.clone()),
            Data::Deferred { provider, .. } => provider(),
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("param_id", &self.param_id)
            .field("byte_len", &self.byte_len())
            .field("deferred", &self.is_deferred())
            .finish()
    }
}

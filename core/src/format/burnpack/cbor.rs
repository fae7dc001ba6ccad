//! The metadata block: encoded exactly as burn-pack's serde + ciborium does, decoded by a
//! bounded pull parser (ciborium-ll) that never allocates more than the input justifies.

use std::collections::BTreeMap;

use ciborium_ll::{Decoder, Encoder, Header};

use crate::dtype::{BoolStore, DType, QuantScheme, Scalar};
use crate::error::{Error, Result};
use crate::format::{Descriptor, DescriptorRef, Limits};

/// The decoded metadata block.
#[derive(Debug, Default)]
pub(crate) struct Metadata {
    /// In the order the map lists them.
    pub tensors: Vec<Descriptor>,
    pub metadata: BTreeMap<String, String>,
    pub scalars: BTreeMap<String, Scalar>,
}

/// Encodes the metadata map. `tensors` must be sorted by name (bytewise), as burn-pack's
/// `BTreeMap<String, _>` orders them.
///
/// With `fixed_width_offsets`, every `data_offsets` value takes the 9-byte CBOR form, so the
/// metadata length does not depend on the offsets' values (any CBOR decoder, burn-pack's
/// included, reads the wider form). Otherwise integers are minimal, as burn-pack writes them.
pub(crate) fn encode(
    tensors: &[DescriptorRef<'_>],
    metadata: &BTreeMap<String, String>,
    scalars: &BTreeMap<String, Scalar>,
    fixed_width_offsets: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + tensors.len() * 64);
    let mut enc = Encoder::from(&mut out);
    // Writing to a Vec cannot fail; the `Infallible`-like error is discarded by `emit`.
    let fields = 1 + usize::from(!metadata.is_empty()) + usize::from(!scalars.is_empty());
    emit(&mut enc, Header::Map(Some(fields)));
    text(&mut enc, "tensors");
    emit(&mut enc, Header::Map(Some(tensors.len())));
    for tensor in tensors {
        text(&mut enc, tensor.name);
        emit(
            &mut enc,
            Header::Map(Some(if tensor.param_id.is_some() { 4 } else { 3 })),
        );
        text(&mut enc, "dtype");
        encode_dtype(&mut enc, tensor.dtype);
        text(&mut enc, "shape");
        emit(&mut enc, Header::Array(Some(tensor.shape.len())));
        for &dim in tensor.shape {
            emit(&mut enc, Header::Positive(dim));
        }
        text(&mut enc, "data_offsets");
        emit(&mut enc, Header::Array(Some(2)));
        for offset in [tensor.offsets.0, tensor.offsets.1] {
            if fixed_width_offsets {
                raw(&mut enc, &[0x1b]);
                raw(&mut enc, &offset.to_be_bytes());
            } else {
                emit(&mut enc, Header::Positive(offset));
            }
        }
        if let Some(id) = tensor.param_id {
            text(&mut enc, "param_id");
            emit(&mut enc, Header::Positive(id));
        }
    }
    if !metadata.is_empty() {
        text(&mut enc, "metadata");
        emit(&mut enc, Header::Map(Some(metadata.len())));
        for (key, value) in metadata {
            text(&mut enc, key);
            text(&mut enc, value);
        }
    }
    if !scalars.is_empty() {
        text(&mut enc, "scalars");
        emit(&mut enc, Header::Map(Some(scalars.len())));
        for (key, value) in scalars {
            text(&mut enc, key);
            emit(&mut enc, Header::Map(Some(1)));
            match *value {
                Scalar::Int(v) => {
                    text(&mut enc, "Int");
                    emit(
                        &mut enc,
                        if v < 0 {
                            Header::Negative(!(v as u64))
                        } else {
                            Header::Positive(v as u64)
                        },
                    );
                }
                Scalar::UInt(v) => {
                    text(&mut enc, "UInt");
                    emit(&mut enc, Header::Positive(v));
                }
                Scalar::Float(v) => {
                    text(&mut enc, "Float");
                    emit(&mut enc, Header::Float(v));
                }
                Scalar::Bool(v) => {
                    text(&mut enc, "Bool");
                    emit(&mut enc, Header::Simple(if v { 21 } else { 20 }));
                }
            }
        }
    }
    out
}

fn encode_dtype(enc: &mut Encoder<&mut Vec<u8>>, dtype: &DType) {
    match dtype {
        DType::Bool(store) => {
            emit(enc, Header::Map(Some(1)));
            text(enc, "Bool");
            text(enc, store.name());
        }
        DType::QFloat(scheme) => {
            emit(enc, Header::Map(Some(1)));
            text(enc, "QFloat");
            raw(enc, scheme.as_cbor());
        }
        plain => text(enc, plain.plain_name().unwrap_or_default()),
    }
}

fn emit(enc: &mut Encoder<&mut Vec<u8>>, header: Header) {
    // Writing into a Vec is infallible.
    let _ = enc.push(header);
}

fn text(enc: &mut Encoder<&mut Vec<u8>>, value: &str) {
    let _ = enc.text(value, None);
}

fn raw(enc: &mut Encoder<&mut Vec<u8>>, bytes: &[u8]) {
    let _ = ciborium_io::Write::write_all(enc, bytes);
}

/// A bounded CBOR pull parser over the metadata block.
struct Parser<'a> {
    input: &'a [u8],
    decoder: Decoder<&'a [u8]>,
    limits: Limits,
    strict: bool,
}

/// Parses a metadata block. `strict` rejects what burn-pack tolerates: duplicate map keys,
/// extra `data_offsets` elements, the pre-0.21 `"Bool"` spelling, and bytes after the item.
pub(crate) fn decode(input: &[u8], limits: &Limits, strict: bool) -> Result<Metadata> {
    let mut parser = Parser {
        input,
        decoder: Decoder::from(input),
        limits: *limits,
        strict,
    };
    let metadata = parser.metadata()?;
    let end = parser.offset();
    if parser.strict && end != input.len() {
        return Err(Error::corrupt(format!(
            "{} bytes follow the metadata item inside the metadata block",
            input.len() - end
        )));
    }
    Ok(metadata)
}

// Here rather than in `dtype`, so the dtype module needs nothing from the format modules.
impl QuantScheme {
    /// Wraps one complete CBOR data item (the value of the `QFloat` key).
    ///
    /// # Errors
    /// [`ErrorKind::Corrupt`](crate::ErrorKind::Corrupt) when `cbor` is not exactly one
    /// well-formed CBOR item.
    pub fn from_cbor(cbor: &[u8]) -> Result<Self> {
        let mut parser = Parser {
            input: cbor,
            decoder: Decoder::from(cbor),
            limits: Limits::default(),
            strict: true,
        };
        // Counted from where a scheme sits in a container, so whatever is accepted here reads
        // back.
        parser.skip(QUANT_SCHEME_DEPTH)?;
        if parser.offset() != cbor.len() {
            return Err(Error::corrupt("bytes follow the CBOR item"));
        }
        Ok(Self::from_checked_cbor(cbor))
    }
}

impl Parser<'_> {
    fn offset(&mut self) -> usize {
        self.decoder.offset()
    }

    fn fail(&mut self, what: impl std::fmt::Display) -> Error {
        let offset = self.offset();
        Error::corrupt(format!("metadata: {what} at metadata byte {offset}"))
    }

    fn header(&mut self) -> Result<Header> {
        match self.decoder.pull() {
            Ok(header) => Ok(header),
            Err(ciborium_ll::Error::Syntax(at)) => Err(Error::corrupt(format!(
                "metadata: invalid CBOR at metadata byte {at}"
            ))),
            Err(ciborium_ll::Error::Io(_)) => Err(self.fail("CBOR ends early")),
        }
    }

    /// Reads `len` raw bytes, after checking that they exist.
    fn take(&mut self, len: usize) -> Result<Vec<u8>> {
        let remaining = self.input.len() - self.offset();
        if len > remaining {
            return Err(self.fail(format!("an item claims {len} bytes but {remaining} remain")));
        }
        let mut buf = vec![0; len];
        ciborium_io::Read::read_exact(&mut self.decoder, &mut buf)
            .map_err(|_| self.fail("CBOR ends early"))?;
        Ok(buf)
    }

    fn text(&mut self) -> Result<String> {
        match self.header()? {
            Header::Text(Some(len)) => {
                let bytes = self.take(len)?;
                String::from_utf8(bytes).map_err(|_| self.fail("text is not UTF-8"))
            }
            Header::Text(None) => Err(self.fail("indefinite-length text is not supported")),
            other => Err(self.fail(format!("expected text, found {}", describe(&other)))),
        }
    }

    fn unsigned(&mut self, what: &str) -> Result<u64> {
        match self.header()? {
            Header::Positive(value) => Ok(value),
            other => Err(self.fail(format!(
                "{what}: expected an unsigned integer, found {}",
                describe(&other)
            ))),
        }
    }

    /// Reads a map or array header: `Some(n)` definite, `None` indefinite.
    fn map_header(&mut self, what: &str) -> Result<Option<usize>> {
        match self.header()? {
            Header::Map(len) => Ok(len),
            other => Err(self.fail(format!(
                "{what}: expected a map, found {}",
                describe(&other)
            ))),
        }
    }

    fn array_header(&mut self, what: &str) -> Result<Option<usize>> {
        match self.header()? {
            Header::Array(len) => Ok(len),
            other => Err(self.fail(format!(
                "{what}: expected an array, found {}",
                describe(&other)
            ))),
        }
    }

    /// Whether another element follows in a container of `len` (counting `index` so far).
    fn has_next(&mut self, len: Option<usize>, index: usize) -> Result<bool> {
        match len {
            Some(len) => Ok(index < len),
            None => match self.header()? {
                Header::Break => Ok(false),
                other => {
                    self.decoder.push(other);
                    Ok(true)
                }
            },
        }
    }

    /// Skips one item, nested at most `max_cbor_depth` deep.
    fn skip(&mut self, depth: usize) -> Result<()> {
        if depth >= self.limits.max_cbor_depth {
            return Err(Error::new(
                crate::error::ErrorKind::LimitExceeded,
                format!(
                    "metadata nests deeper than {} levels",
                    self.limits.max_cbor_depth
                ),
            ));
        }
        match self.header()? {
            Header::Positive(_) | Header::Negative(_) | Header::Float(_) | Header::Simple(_) => {}
            Header::Break => return Err(self.fail("unexpected break")),
            Header::Tag(_) => self.skip(depth + 1)?,
            Header::Bytes(Some(len)) | Header::Text(Some(len)) => {
                let remaining = self.input.len() - self.offset();
                if len > remaining {
                    return Err(
                        self.fail(format!("an item claims {len} bytes but {remaining} remain"))
                    );
                }
                let mut chunk = [0u8; 256];
                let mut left = len;
                while left > 0 {
                    let step = left.min(chunk.len());
                    ciborium_io::Read::read_exact(&mut self.decoder, &mut chunk[..step])
                        .map_err(|_| self.fail("CBOR ends early"))?;
                    left -= step;
                }
            }
            Header::Bytes(None) | Header::Text(None) => {
                return Err(self.fail("indefinite-length strings are not supported"));
            }
            Header::Array(len) => {
                let mut index = 0;
                while self.has_next(len, index)? {
                    self.skip(depth + 1)?;
                    index += 1;
                }
            }
            Header::Map(len) => {
                let mut index = 0;
                while self.has_next(len, index)? {
                    self.skip(depth + 1)?;
                    self.skip(depth + 1)?;
                    index += 1;
                }
            }
        }
        Ok(())
    }

    fn duplicate(&mut self, what: &str, key: &str) -> Result<()> {
        if self.strict {
            return Err(self.fail(format!("duplicate {what} `{key}`")));
        }
        Ok(())
    }

    fn metadata(&mut self) -> Result<Metadata> {
        let len = self.map_header("top level")?;
        let mut metadata = Metadata::default();
        let mut seen = [false; 3];
        let mut index = 0;
        while self.has_next(len, index)? {
            index += 1;
            let key = self.text()?;
            let slot = match key.as_str() {
                "tensors" => 0,
                "metadata" => 1,
                "scalars" => 2,
                _ => {
                    // Unknown fields are ignored, as burn-pack does, for forward compatibility.
                    self.skip(1)?;
                    continue;
                }
            };
            if std::mem::replace(&mut seen[slot], true) {
                self.duplicate("field", &key)?;
            }
            match slot {
                0 => metadata.tensors = self.tensors()?,
                1 => metadata.metadata = self.string_map()?,
                _ => metadata.scalars = self.scalars()?,
            }
        }
        if !seen[0] {
            return Err(Error::corrupt("metadata: missing field `tensors`"));
        }
        Ok(metadata)
    }

    fn tensors(&mut self) -> Result<Vec<Descriptor>> {
        let len = self.map_header("tensors")?;
        let max = self.limits.max_tensor_count;
        if len.is_some_and(|len| len > max) {
            return Err(too_many_tensors(len.unwrap_or_default(), max));
        }
        // Reserve for the declared count, but never for more descriptors than the remaining
        // bytes can encode: a claim alone must not size an allocation.
        let remaining = self.input.len() - self.offset();
        let mut tensors = Vec::with_capacity(len.unwrap_or(0).min(remaining / MIN_DESCRIPTOR_LEN));
        while self.has_next(len, tensors.len())? {
            if tensors.len() == max {
                return Err(too_many_tensors(max + 1, max));
            }
            let name = self.text()?;
            let descriptor = self.descriptor(name)?;
            tensors.push(descriptor);
        }
        Ok(tensors)
    }

    fn descriptor(&mut self, name: String) -> Result<Descriptor> {
        let len = self
            .map_header("tensor descriptor")
            .map_err(|e| e.with_tensor(&name))?;
        let (mut dtype, mut shape, mut offsets, mut param_id) = (None, None, None, None);
        let mut index = 0;
        while self.has_next(len, index)? {
            index += 1;
            let key = self.text()?;
            let duplicate = match key.as_str() {
                "dtype" => dtype.replace(self.dtype()?).is_some(),
                "shape" => shape.replace(self.shape()?).is_some(),
                "data_offsets" => offsets.replace(self.offsets()?).is_some(),
                "param_id" => param_id.replace(self.param_id()?).is_some(),
                _ => {
                    self.skip(DESCRIPTOR_FIELD_DEPTH)?;
                    false
                }
            };
            if duplicate {
                self.duplicate("descriptor field", &key)
                    .map_err(|e| e.with_tensor(&name))?;
            }
        }
        let missing = |field: &str| {
            Error::corrupt(format!("metadata: descriptor has no `{field}`")).with_tensor(&name)
        };
        Ok(Descriptor {
            dtype: dtype.ok_or_else(|| missing("dtype"))?,
            shape: shape.ok_or_else(|| missing("shape"))?,
            offsets: offsets.ok_or_else(|| missing("data_offsets"))?,
            param_id: param_id.flatten(),
            name,
        })
    }

    fn dtype(&mut self) -> Result<DType> {
        match self.header()? {
            Header::Text(len) => {
                self.decoder.push(Header::Text(len));
                let name = self.text()?;
                if let Some(dtype) = DType::from_plain_name(&name) {
                    return Ok(dtype);
                }
                if name == "Bool" && !self.strict {
                    // burn before 0.21 spelled bool tensors as a bare "Bool" (one byte each).
                    return Ok(DType::Bool(BoolStore::Native));
                }
                Err(self.fail(format!("unknown dtype `{name}`")))
            }
            Header::Map(Some(1)) => {
                let variant = self.text()?;
                match variant.as_str() {
                    "Bool" => {
                        let store = self.text()?;
                        let store = match store.as_str() {
                            "Native" => BoolStore::Native,
                            "U8" => BoolStore::U8,
                            "U32" => BoolStore::U32,
                            _ => return Err(self.fail(format!("unknown bool store `{store}`"))),
                        };
                        Ok(DType::Bool(store))
                    }
                    "QFloat" => {
                        let start = self.offset();
                        self.skip(QUANT_SCHEME_DEPTH)?;
                        let end = self.offset();
                        Ok(DType::QFloat(QuantScheme::from_cbor(
                            &self.input[start..end],
                        )?))
                    }
                    _ => Err(self.fail(format!("unknown dtype `{variant}`"))),
                }
            }
            other => Err(self.fail(format!(
                "dtype: expected text or a one-entry map, found {}",
                describe(&other)
            ))),
        }
    }

    fn shape(&mut self) -> Result<Vec<u64>> {
        let len = self.array_header("shape")?;
        let max = self.limits.max_tensor_rank;
        if len.is_some_and(|len| len > max) {
            return Err(too_many_dims(len.unwrap_or_default(), max));
        }
        let mut shape = Vec::with_capacity(len.unwrap_or(0));
        while self.has_next(len, shape.len())? {
            if shape.len() == max {
                return Err(too_many_dims(max + 1, max));
            }
            shape.push(self.unsigned("shape")?);
        }
        Ok(shape)
    }

    fn offsets(&mut self) -> Result<(u64, u64)> {
        let len = self.array_header("data_offsets")?;
        if len.is_some_and(|len| len < 2) {
            return Err(self.fail("data_offsets: expected [start, end]"));
        }
        let mut values = [0u64; 2];
        let mut index = 0;
        while self.has_next(len, index)? {
            match values.get_mut(index) {
                Some(slot) => *slot = self.unsigned("data_offsets")?,
                None if self.strict => {
                    return Err(self.fail("data_offsets: more than two elements"));
                }
                None => self.skip(DESCRIPTOR_FIELD_DEPTH + 1)?,
            }
            index += 1;
        }
        if index < 2 {
            return Err(self.fail("data_offsets: expected [start, end]"));
        }
        Ok((values[0], values[1]))
    }

    fn param_id(&mut self) -> Result<Option<u64>> {
        match self.header()? {
            Header::Positive(id) => Ok(Some(id)),
            Header::Simple(22) => Ok(None), // null, as serde writes a `None` it did not skip
            other => Err(self.fail(format!(
                "param_id: expected an unsigned integer, found {}",
                describe(&other)
            ))),
        }
    }

    fn string_map(&mut self) -> Result<BTreeMap<String, String>> {
        let len = self.map_header("metadata")?;
        let mut map = BTreeMap::new();
        let mut index = 0;
        while self.has_next(len, index)? {
            if index == self.limits.max_tensor_count {
                return Err(Error::new(
                    crate::error::ErrorKind::LimitExceeded,
                    format!(
                        "more than {} metadata entries",
                        self.limits.max_tensor_count
                    ),
                ));
            }
            index += 1;
            let key = self.text()?;
            let value = self.text()?;
            if map.insert(key.clone(), value).is_some() {
                self.duplicate("metadata key", &key)?;
            }
        }
        Ok(map)
    }

    fn scalars(&mut self) -> Result<BTreeMap<String, Scalar>> {
        let len = self.map_header("scalars")?;
        let mut map = BTreeMap::new();
        let mut index = 0;
        while self.has_next(len, index)? {
            if index == self.limits.max_tensor_count {
                return Err(Error::new(
                    crate::error::ErrorKind::LimitExceeded,
                    format!("more than {} scalars entries", self.limits.max_tensor_count),
                ));
            }
            index += 1;
            let key = self.text()?;
            let value = self.scalar()?;
            if map.insert(key.clone(), value).is_some() {
                self.duplicate("scalar", &key)?;
            }
        }
        Ok(map)
    }

    fn scalar(&mut self) -> Result<Scalar> {
        if self.map_header("scalar")? != Some(1) {
            return Err(self.fail("scalar: expected a one-entry map"));
        }
        let variant = self.text()?;
        let value = self.header()?;
        let scalar = match (variant.as_str(), value) {
            ("Int", Header::Positive(v)) => i64::try_from(v).ok().map(Scalar::Int),
            ("Int", Header::Negative(v)) => i64::try_from(v).ok().map(|v| Scalar::Int(!v)),
            ("UInt", Header::Positive(v)) => Some(Scalar::UInt(v)),
            ("Float", Header::Float(v)) => Some(Scalar::Float(v)),
            ("Bool", Header::Simple(20)) => Some(Scalar::Bool(false)),
            ("Bool", Header::Simple(21)) => Some(Scalar::Bool(true)),
            _ => None,
        };
        scalar.ok_or_else(|| {
            self.fail(format!(
                "scalar: invalid {variant} value {}",
                describe(&value)
            ))
        })
    }
}

/// Nesting depth of a descriptor's field values: top-level map, `tensors` map, descriptor map.
const DESCRIPTOR_FIELD_DEPTH: usize = 3;
/// Nesting depth of a QFloat scheme: inside the dtype's one-entry map.
const QUANT_SCHEME_DEPTH: usize = DESCRIPTOR_FIELD_DEPTH + 1;

/// The fewest bytes one `tensors` entry can take: a one-byte name, a map header, and the
/// keys and smallest values of `dtype` ("U8"), `shape` ([]) and `data_offsets` ([0, 0]).
const MIN_DESCRIPTOR_LEN: usize = 1 + 1 + (6 + 3) + (6 + 1) + (13 + 3);

fn too_many_tensors(count: usize, max: usize) -> Error {
    Error::new(
        crate::error::ErrorKind::LimitExceeded,
        format!("metadata declares {count} tensors, more than the limit of {max}"),
    )
}

fn too_many_dims(rank: usize, max: usize) -> Error {
    Error::new(
        crate::error::ErrorKind::LimitExceeded,
        format!("a shape has {rank} dimensions, more than the limit of {max}"),
    )
}

fn describe(header: &Header) -> String {
    match header {
        Header::Positive(v) => format!("integer {v}"),
        Header::Negative(_) => "a negative integer".into(),
        Header::Float(v) => format!("float {v}"),
        Header::Simple(20 | 21) => "a bool".into(),
        Header::Simple(22) => "null".into(),
        Header::Simple(v) => format!("simple value {v}"),
        Header::Tag(t) => format!("tag {t}"),
        Header::Break => "break".into(),
        Header::Bytes(_) => "a byte string".into(),
        Header::Text(_) => "text".into(),
        Header::Array(_) => "an array".into(),
        Header::Map(_) => "a map".into(),
    }
}

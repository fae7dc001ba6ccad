//! Incremental saves: the container a full save would write, cut into pieces
//! ([`content::cut`]), each piece hashed before it is sent; a piece whose hash an earlier
//! checkpoint already holds is not written, and the commit record refers to that checkpoint's
//! bytes instead. Before it refers to anything, the save announces what it may refer to, so
//! a gc running meanwhile keeps it (the protocol is on [`Checkpoints::gc`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Instant;

use weightbay::checksum::{crc32c, crc32c_append, crc32c_combine};
use weightbay::codec::{Codec, Elements};
use weightbay::{AccessPolicy, Bytes, Error, ErrorKind, Result, Sink, StorageExt, Writer};

use crate::content::{Cut, DEFAULT_CHUNK_LEN, cut, hash_all, hex, xxh3_128};
use crate::encoders::{Encoded, Encoders};
use crate::layout;
use crate::record::{
    ANNOUNCEMENT_VERSION, Announcement, CommitRecord, Encoding, PieceRecord, Pieces, encode,
    now_unix_ms,
};
use crate::run::Checkpoints;

/// What an incremental save compares against, and how it cuts tensors.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Incremental {
    /// The checkpoint whose pieces may be referred to; `None`: the newest complete one.
    pub base: Option<u64>,
    /// The longest piece a tensor is cut into.
    pub chunk_len: u64,
    /// Write every piece (a full save that a chain starts from again) once the base is this
    /// many increments from its own full save.
    pub rebase_after: Option<u32>,
    /// Tensors the caller knows are unchanged since the base (frozen weights): their pieces
    /// are referred to by name, without hashing their bytes.
    pub unchanged: BTreeSet<String>,
    /// Hash the tensors declared unchanged all the same, and fail the save if one differs.
    pub check_unchanged: bool,
    /// Store each written piece encoded ([`Codec::Planes`], by its tensor's element width)
    /// where that makes it smaller.
    pub compress: bool,
}

impl Default for Incremental {
    fn default() -> Self {
        Self {
            base: None,
            chunk_len: DEFAULT_CHUNK_LEN,
            rebase_after: None,
            unchanged: BTreeSet::new(),
            check_unchanged: false,
            compress: false,
        }
    }
}

/// What a piece of the new container will be.
#[derive(Debug, Clone)]
pub(crate) enum Decision {
    /// The base holds it: refer to its bytes.
    Reuse(PieceRecord),
    /// Changed: write it; its hash is known.
    Write(u128),
    /// Not hashed ahead (the header, the trailer, a deferred tensor's chunk): hashed as it
    /// streams, then written or referred to.
    Decide,
}

/// A base checkpoint and the save's announcement that it will refer to it.
pub(crate) struct Base {
    pub(crate) record: CommitRecord,
    /// When the announcement was written, by this process's clock.
    pub(crate) announced: Instant,
}

impl Checkpoints {
    /// The checkpoint an incremental save of `step` refers to, announced first and read again
    /// after: `None` (a full save) when there is none with pieces, when the chain is
    /// `rebase_after` long, or when the base went away meanwhile. The save is announced in
    /// every case, as every save is ([`announce`](Self::announce)).
    pub(crate) fn announce_base(
        &self,
        step: u64,
        save_token: &str,
        options: &Incremental,
    ) -> Result<Option<Base>> {
        let found = match options.base {
            Some(base) => Some(self.open(base)?),
            None => self.latest()?,
        };
        let found = found.filter(|found| {
            found.record.pieces.as_ref().is_some_and(|pieces| {
                options
                    .rebase_after
                    .is_none_or(|after| pieces.increment < after)
            })
        });
        let keys: BTreeSet<String> = found
            .iter()
            .flat_map(|found| found.record.pieces.iter().flat_map(|p| &p.list))
            .map(|piece| piece.key.clone())
            .collect();
        let announced = self.announce(step, save_token, keys.into_iter().collect())?;
        let Some(found) = found else { return Ok(None) };
        // Read after announcing: a gc that could not see the announcement saw this record, and
        // kept what it refers to (the protocol on `gc`).
        match self.read_record(found.step()) {
            Ok(record) if record == found.record => Ok(Some(Base { record, announced })),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Announces that the save `save_token` of `step` writes into its save directory
    /// (`<step>/<save_token>/`, named by the announcement's key) and may refer to `keys`
    /// (relative to the prefix), so a gc pass keeps both for the lease (the protocol on
    /// [`Checkpoints::gc`]); returns when, by this process's clock. Every save, copy and
    /// rank announces itself before it writes anything.
    pub(crate) fn announce(
        &self,
        step: u64,
        save_token: &str,
        keys: Vec<String>,
    ) -> Result<Instant> {
        let announcement = Announcement {
            weightbay_announcement: ANNOUNCEMENT_VERSION,
            step,
            time_unix_ms: now_unix_ms(),
            keys,
        };
        let announced = Instant::now();
        let key = layout::announcement_key(&self.prefix, step, save_token);
        // Atomic, not fsynced: it protects a writer that is running, and a power loss ends
        // every writer of the machine it was on (a save that dies leaves nothing it needs).
        self.storage
            .write_new(
                &key,
                &encode(&announcement)?,
                weightbay::Durability::Flushed,
            )
            .map_err(|e| e.with_key(&key))?;
        Ok(announced)
    }

    /// Removes the announcement of the save into `save_dir`, best effort: for a save that
    /// committed (its record protects what it needs now) or failed with nothing committed (so
    /// what it refers to need not wait out the lease).
    pub(crate) fn withdraw(&self, step: u64, save_dir: &str) {
        let token = layout::save_token(save_dir);
        let _ = self
            .storage
            .delete(&layout::announcement_key(&self.prefix, step, token));
    }

    /// How long after announcing a writer may still rely on its announcement when it writes
    /// its record: five sixths of the lease, since a gc pass deletes for up to a sixth of it
    /// after reading the announcements.
    pub(crate) fn commit_window(&self) -> std::time::Duration {
        self.lease - self.lease / 6
    }

    /// Fails unless an announcement made at `announced` is young enough for every gc to
    /// honour it still.
    pub(crate) fn check_lease(&self, announced: Option<Instant>) -> Result<()> {
        let Some(announced) = announced else {
            return Ok(());
        };
        let limit = self.commit_window();
        if announced.elapsed() < limit {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::TimedOut,
            format!(
                "the save took longer than {limit:?} after announcing the containers it refers \
                 to, so gc may have removed them: nothing was committed"
            ),
        ))
    }
}

/// What an incremental save will write: the container's length, its pieces and what each
/// will be, and the CRC32C of every tensor the base holds whole.
pub(crate) struct Plan<'a> {
    pub(crate) len: u64,
    pub(crate) cuts: Vec<Cut>,
    pub(crate) decisions: Vec<Decision>,
    pub(crate) known_crcs: BTreeMap<usize, u32>,
    /// The base's pieces, for the pieces decided as they stream.
    base: BaseIndex<'a>,
}

impl Plan<'static> {
    /// The pieces of a container of `len` bytes whose tensors lie at `tensors` (ascending),
    /// with no base: each is hashed as it streams and written. A compressed copy's plan.
    pub(crate) fn whole(len: u64, tensors: &[std::ops::Range<u64>], chunk_len: u64) -> Self {
        let cuts = cut(len, tensors, chunk_len);
        Self {
            len,
            decisions: vec![Decision::Decide; cuts.len()],
            cuts,
            known_crcs: BTreeMap::new(),
            base: BaseIndex::new(None),
        }
    }
}

/// The pieces of `writer`'s container and what each will be, given `base`.
pub(crate) fn plan<'a>(
    writer: &Writer,
    base: Option<&'a Pieces>,
    options: &Incremental,
) -> Result<Plan<'a>> {
    let len = writer.size()?;
    let cuts = cut(len, &writer.tensor_ranges()?, options.chunk_len);
    let tensors = writer.tensors();
    let index = BaseIndex::new(base);
    // Each tensor's pieces, in order.
    let mut by_tensor: Vec<Vec<usize>> = vec![Vec::new(); tensors.len()];
    for (i, piece) in cuts.iter().enumerate() {
        if let Some((tensor, _)) = &piece.tensor {
            by_tensor[*tensor].push(i);
        }
    }
    let mut by_name: BTreeMap<&str, Vec<&PieceRecord>> = BTreeMap::new();
    for piece in base.iter().flat_map(|b| &b.list) {
        if let Some(name) = &piece.tensor {
            by_name.entry(name).or_default().push(piece);
        }
    }
    let mut decisions = vec![Decision::Decide; cuts.len()];
    // A tensor declared unchanged takes the base's pieces of that name, when they are cut the
    // same way.
    let mut claimed = vec![false; cuts.len()];
    for (index, tensor) in tensors.iter().enumerate() {
        if !options.unchanged.contains(tensor.name()) {
            continue;
        }
        let mine = &by_tensor[index];
        let theirs = by_name.get(tensor.name()).map_or(&[][..], Vec::as_slice);
        let same_cut = mine.len() == theirs.len()
            && mine
                .iter()
                .zip(theirs)
                .all(|(&i, p)| p.len == cuts[i].range.end - cuts[i].range.start);
        if same_cut {
            for (&i, piece) in mine.iter().zip(theirs) {
                decisions[i] = Decision::Reuse((*piece).clone());
                claimed[i] = true;
            }
        }
    }
    // Every other chunk of a tensor whose bytes lie in memory is hashed now, on every core.
    let resident: Vec<Option<Bytes>> = tensors
        .iter()
        .map(|t| {
            if t.is_deferred() {
                return None;
            }
            let bytes = t.bytes().ok()?;
            bytes.read(AccessPolicy::ZeroCopy).is_ok().then_some(bytes)
        })
        .collect();
    let mut jobs: Vec<(usize, &[u8])> = Vec::new();
    for (i, piece) in cuts.iter().enumerate() {
        let Some((tensor, own)) = &piece.tensor else {
            continue;
        };
        if claimed[i] && !options.check_unchanged {
            continue;
        }
        let Some(bytes) = &resident[*tensor] else {
            continue;
        };
        let memory = bytes.read(AccessPolicy::ZeroCopy)?;
        jobs.push((i, &memory[own.start as usize..own.end as usize]));
    }
    let hashes = hash_all(&jobs.iter().map(|&(_, data)| data).collect::<Vec<_>>());
    for (&(i, _), hash) in jobs.iter().zip(hashes) {
        let text = hex(hash);
        if claimed[i] {
            if let Decision::Reuse(piece) = &decisions[i]
                && piece.xxh3 != text
            {
                let name = piece.tensor.as_deref().unwrap_or_default();
                return Err(Error::invalid(format!(
                    "tensor `{name}` was declared unchanged, but its bytes differ from the base's"
                ))
                .with_tensor(name));
            }
            continue;
        }
        decisions[i] = match index.find(&cuts[i].range, &text) {
            Some(piece) => Decision::Reuse(piece.clone()),
            None => Decision::Write(hash),
        };
    }
    // A tensor all of whose chunks the base holds has its CRC32C in the base's record: the
    // trailer takes it from there instead of summing the bytes again.
    let mut known = BTreeMap::new();
    for (tensor, pieces) in by_tensor.iter().enumerate() {
        let crc = pieces.iter().try_fold(0u32, |crc, &i| match &decisions[i] {
            Decision::Reuse(base) => Some(crc32c_combine(crc, base.crc32c, base.len as usize)),
            _ => None,
        });
        if let (false, Some(crc)) = (pieces.is_empty(), crc) {
            known.insert(tensor, crc);
        }
    }
    Ok(Plan {
        len,
        cuts,
        decisions,
        known_crcs: known,
        base: index,
    })
}

/// The base's pieces, found by where they start in its container and by hash.
struct BaseIndex<'a> {
    at: HashMap<u64, &'a PieceRecord>,
    by_hash: HashMap<&'a str, &'a PieceRecord>,
}

impl<'a> BaseIndex<'a> {
    fn new(base: Option<&'a Pieces>) -> Self {
        let mut at = HashMap::new();
        let mut start = 0;
        for piece in base.iter().flat_map(|b| &b.list) {
            at.insert(start, piece);
            start += piece.len;
        }
        let by_hash = base
            .iter()
            .flat_map(|b| &b.list)
            .map(|p| (p.xxh3.as_str(), p))
            .collect();
        Self { at, by_hash }
    }

    /// The base's piece to refer to for the piece at `range` whose hash is `hash`: the one at
    /// the same place when it holds the same bytes (so an unchanged tensor stays one run of
    /// one container, read as one), else any with the same bytes.
    fn find(&self, range: &std::ops::Range<u64>, hash: &str) -> Option<&'a PieceRecord> {
        let len = range.end - range.start;
        let same = |piece: &&&PieceRecord| piece.len == len && piece.xxh3 == hash;
        self.at
            .get(&range.start)
            .filter(same)
            .or_else(|| self.by_hash.get(hash).filter(same))
            .copied()
    }
}

/// A sink that takes the whole container a writer streams and stores only the pieces the
/// base does not hold, noting every piece for the commit record.
pub(crate) struct DeltaSink<'a> {
    inner: Box<dyn Sink>,
    /// The stored container's key relative to the run's prefix, as pieces refer to it.
    stored_key: String,
    cuts: Vec<Cut>,
    decisions: Vec<Decision>,
    names: Vec<String>,
    /// For a save that compresses, each tensor's elements, which its pieces are encoded by.
    elements: Option<Vec<Elements>>,
    base: BaseIndex<'a>,
    next: usize,
    position: u64,
    written: u64,
    /// The piece being decided, as it streams.
    buffer: Vec<u8>,
    /// For a save that compresses: the workers encoding its pieces, the pieces on their way
    /// out in the container's order, and buffers the workers gave back.
    encoders: Option<Encoders>,
    queue: VecDeque<Queued>,
    spare: Vec<Vec<u8>>,
    /// The CRC32C of the piece being written.
    crc: u32,
    pieces: Vec<PieceRecord>,
}

/// A piece of a compressed save on its way out, in the container's order.
enum Queued {
    /// Decided: its record.
    Done(PieceRecord),
    /// With a worker: the number to take it back by, and what its record needs.
    Encoding {
        seq: u64,
        hash: u128,
        tensor: Option<String>,
    },
}

impl<'a> DeltaSink<'a> {
    /// A sink storing into `inner` what `plan` decided; `elements` (each tensor's) when the
    /// pieces it writes are to be encoded.
    pub(crate) fn new(
        inner: Box<dyn Sink>,
        stored_key: String,
        plan: Plan<'a>,
        names: Vec<String>,
        elements: Option<Vec<Elements>>,
    ) -> Self {
        let encoders = elements.as_ref().map(|_| Encoders::new());
        Self {
            inner,
            stored_key,
            cuts: plan.cuts,
            decisions: plan.decisions,
            names,
            elements,
            base: plan.base,
            next: 0,
            position: 0,
            written: 0,
            buffer: Vec::new(),
            encoders,
            queue: VecDeque::new(),
            spare: Vec::new(),
            crc: 0,
            pieces: Vec::new(),
        }
    }

    /// Every piece, once the whole container has streamed in (and every encoded one is
    /// written): the commit record's list.
    pub(crate) fn pieces(&mut self) -> Result<&[PieceRecord]> {
        self.drain(true)?;
        if self.next != self.cuts.len() {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "the writer stopped at byte {} of a planned {}",
                    self.position,
                    self.cuts.last().map_or(0, |c| c.range.end)
                ),
            ));
        }
        Ok(&self.pieces)
    }

    /// Commits the stored container, once every encoded piece is written.
    pub(crate) fn commit(mut self) -> Result<()> {
        self.drain(true)?;
        self.inner.commit()
    }

    fn tensor(&self, piece: &Cut) -> Option<String> {
        piece.tensor.as_ref().map(|(t, _)| self.names[*t].clone())
    }

    /// Ends piece `next`, whose bytes have all streamed in.
    fn finish(&mut self) -> Result<()> {
        let piece = self.cuts[self.next].clone();
        let len = piece.range.end - piece.range.start;
        let tensor = self.tensor(&piece);
        let record = match std::mem::replace(&mut self.decisions[self.next], Decision::Decide) {
            Decision::Reuse(base) => Some(PieceRecord { tensor, ..base }),
            Decision::Write(hash) if self.encoders.is_none() => {
                Some(self.written_piece(len, hash, tensor, None))
            }
            Decision::Write(hash) => self.store(&piece, hash, tensor)?,
            Decision::Decide => {
                let hash = xxh3_128(&self.buffer);
                match self.base.find(&piece.range, &hex(hash)) {
                    Some(base) => Some(PieceRecord {
                        tensor,
                        ..base.clone()
                    }),
                    None => self.store(&piece, hash, tensor)?,
                }
            }
        };
        match (record, &self.encoders) {
            (Some(record), None) => self.pieces.push(record),
            (Some(record), Some(_)) => self.queue.push_back(Queued::Done(record)),
            (None, _) => {}
        }
        self.buffer.clear();
        self.crc = 0;
        self.next += 1;
        self.drain(false)
    }

    /// Writes the buffered piece `piece` and returns its record or, for a save that
    /// compresses, hands it to a worker and queues it.
    fn store(
        &mut self,
        piece: &Cut,
        hash: u128,
        tensor: Option<String>,
    ) -> Result<Option<PieceRecord>> {
        let Some(elements) = &self.elements else {
            self.crc = crc32c(&self.buffer);
            self.inner.write(&self.buffer)?;
            let len = self.buffer.len() as u64;
            return Ok(Some(self.written_piece(len, hash, tensor, None)));
        };
        let elements = match &piece.tensor {
            Some((index, _)) => elements[*index],
            None => Elements::BYTES,
        };
        // Waits for the oldest piece out when as many are out as may be.
        self.drain(false)?;
        let logical = std::mem::replace(&mut self.buffer, self.spare.pop().unwrap_or_default());
        let frame = self.spare.pop().unwrap_or_default();
        let encoders = self
            .encoders
            .as_mut()
            .expect("a save that compresses has workers");
        let seq = encoders.submit(logical, frame, elements)?;
        self.queue.push_back(Queued::Encoding { seq, hash, tensor });
        Ok(None)
    }

    /// Moves the queue's decided pieces to the record, writing encoded ones in order as their
    /// workers finish: waiting for each when `all`, or for the oldest when as many are out as
    /// may be, otherwise only as far as they are done.
    fn drain(&mut self, all: bool) -> Result<()> {
        while let Some(front) = self.queue.front() {
            let seq = match front {
                Queued::Done(_) => None,
                Queued::Encoding { seq, .. } => Some(*seq),
            };
            let Some(seq) = seq else {
                if let Some(Queued::Done(record)) = self.queue.pop_front() {
                    self.pieces.push(record);
                }
                continue;
            };
            let encoders = self.encoders.as_mut().expect("queued pieces have workers");
            let wait = all || encoders.is_full();
            let Some(encoded) = encoders.take(seq, wait) else {
                return Ok(());
            };
            let Some(Queued::Encoding { hash, tensor, .. }) = self.queue.pop_front() else {
                unreachable!("the front was an encoding piece");
            };
            self.write_encoded(encoded?, hash, tensor)?;
        }
        Ok(())
    }

    /// Writes a piece a worker is done with, its frame where it shrank, and records it.
    fn write_encoded(
        &mut self,
        encoded: Encoded,
        hash: u128,
        tensor: Option<String>,
    ) -> Result<()> {
        let len = encoded.logical.len() as u64;
        self.crc = encoded.crc32c;
        let encoding = if encoded.shrank {
            self.inner.write(&encoded.frame)?;
            Some(Encoding {
                codec: Codec::Planes.name().to_owned(),
                len: encoded.frame.len() as u64,
                crc32c: crc32c(&encoded.frame),
            })
        } else {
            self.inner.write(&encoded.logical)?;
            None
        };
        let record = self.written_piece(len, hash, tensor, encoding);
        self.pieces.push(record);
        self.crc = 0;
        let (mut logical, mut frame) = (encoded.logical, encoded.frame);
        logical.clear();
        frame.clear();
        self.spare.extend([logical, frame]);
        Ok(())
    }

    /// The record of a piece of `len` bytes just written, at [`written`](Self::written).
    fn written_piece(
        &mut self,
        len: u64,
        hash: u128,
        tensor: Option<String>,
        encoding: Option<Encoding>,
    ) -> PieceRecord {
        let stored = encoding.as_ref().map_or(len, |e| e.len);
        let record = PieceRecord {
            len,
            key: self.stored_key.clone(),
            offset: self.written,
            crc32c: self.crc,
            xxh3: hex(hash),
            tensor,
            encoding,
        };
        self.written += stored;
        record
    }
}

// Every method named: padding goes through `write`, which decides piece by piece what is
// stored; nothing is read back or written by position, since what is stored is not the
// container.
#[deny(clippy::missing_trait_methods)]
impl Sink for DeltaSink<'_> {
    fn pad(&mut self, len: u64) -> Result<()> {
        weightbay::backend_kit::pad_with_zeros(self, len)
    }

    fn read_back(&self) -> Option<std::sync::Arc<dyn weightbay::ReadBack>> {
        None
    }

    fn positioned(&mut self) -> Option<Box<dyn weightbay::PositionedWrite + '_>> {
        None
    }

    fn write(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let Some(piece) = self.cuts.get(self.next) else {
                return Err(Error::new(
                    ErrorKind::Io,
                    "the writer wrote past the container it planned",
                ));
            };
            let n = (piece.range.end - self.position).min(data.len() as u64) as usize;
            let (now, rest) = data.split_at(n);
            match &self.decisions[self.next] {
                Decision::Reuse(_) => {}
                // Streamed through unless it is to be encoded, which takes the whole piece.
                Decision::Write(_) if self.encoders.is_none() => {
                    self.inner.write(now)?;
                    self.crc = crc32c_append(self.crc, now);
                }
                Decision::Write(_) | Decision::Decide => self.buffer.extend_from_slice(now),
            }
            self.position += n as u64;
            data = rest;
            if self.position == piece.range.end {
                self.finish()?;
            }
        }
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<()> {
        (*self).commit()
    }
}

/// The CRC32C of the whole container the pieces make up.
pub(crate) fn combined_crc(pieces: &[PieceRecord]) -> u32 {
    pieces.iter().fold(0, |crc, piece| {
        crc32c_combine(crc, piece.crc32c, piece.len as usize)
    })
}

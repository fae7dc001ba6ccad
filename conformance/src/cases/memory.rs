//! Memory: writing a checkpoint many times larger than any bound keeps the peak of live heap
//! bytes within one tensor, the writer's buffer and the backend's declared buffer.

use weightbay::{Bytes, DType, Tensor, Writer};

use crate::Harness;
use crate::holdings::KEY;
use crate::outcome::{Outcome, fail};

/// Writing 64 deferred tensors of 4 MiB through the backend keeps the peak of live heap bytes
/// within one tensor, the writer's buffer, and the backend's declared buffer bound.
pub fn peak_memory_is_bounded<H: Harness>(harness: &H, case: &str) -> Outcome {
    let Some(allocator) = crate::alloc::installed() else {
        return Outcome::NotApplicable(
            "the counting allocator is not installed: run it through memory_bound!".into(),
        );
    };
    const TENSORS: usize = 64;
    const TENSOR_LEN: usize = 4 << 20;
    let storage = harness.fresh();
    let tensors: Vec<Tensor> = (0..TENSORS)
        .map(|i| {
            Tensor::deferred(
                format!("t{i:02}"),
                DType::U8,
                [TENSOR_LEN as u64],
                TENSOR_LEN as u64,
                move || Ok(Bytes::from(vec![i as u8; TENSOR_LEN])),
            )
        })
        .collect();
    let writer = Writer::new(tensors);
    let total = writer.size().unwrap_or_else(|e| fail!(case, "size: {e}"));
    let baseline = allocator.reset();
    writer
        .write_to(&storage, KEY)
        .unwrap_or_else(|e| fail!(case, "write_to: {e}"));
    let peak = allocator.peak().saturating_sub(baseline) as u64;
    let slack = 2 << 20;
    let bound = TENSOR_LEN as u64
        + weightbay::WRITE_CHUNK_LEN as u64
        + harness.write_buffer_bound(total)
        + slack;
    println!("{case}: peak {peak} bytes live while writing {total} bytes (bound {bound})");
    if peak > bound {
        fail!(
            case,
            "writing {total} bytes peaked at {peak} live heap bytes, over the bound of {bound}"
        );
    }
    Outcome::Checked
}

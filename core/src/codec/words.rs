//! Whole elements to byte planes and back, as words: each element read as a little-endian
//! integer (rotated left one bit for floats, so the sign bit sits below the mantissa and the
//! top byte holds the exponent), its byte `p` written to plane `p`. As words, the compiler
//! turns each loop into shifts and packs of whole vectors.

/// Splits `elements` into `planes`, each at least one byte per whole element.
pub(super) fn split(elements: &[u8], width: usize, rotate: bool, planes: Vec<&mut [u8]>) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: this CPU has AVX2, checked just above.
        return unsafe { split_avx2(elements, width, rotate, planes) };
    }
    split_any(elements, width, rotate, planes);
}

/// Joins `planes`, each at least one byte per whole element, into `elements`: the inverse of
/// [`split`].
pub(super) fn merge(planes: &[&[u8]], width: usize, rotate: bool, elements: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: this CPU has AVX2, checked just above.
        return unsafe { merge_avx2(planes, width, rotate, elements) };
    }
    merge_any(planes, width, rotate, elements);
}

// The same loops compiled for AVX2 too (the functions below are inlined into these): twice the
// bytes a vector, which on this project's machine took f32 pieces from 0.9 to 1.2 GiB/s on one
// core; the portable build has SSE2 only.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn split_avx2(elements: &[u8], width: usize, rotate: bool, planes: Vec<&mut [u8]>) {
    split_any(elements, width, rotate, planes);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn merge_avx2(planes: &[&[u8]], width: usize, rotate: bool, elements: &mut [u8]) {
    merge_any(planes, width, rotate, elements);
}

#[inline(always)]
fn split_any(elements: &[u8], width: usize, rotate: bool, planes: Vec<&mut [u8]>) {
    match width {
        2 => split2(elements, rotate, planes),
        4 => split4(elements, rotate, planes),
        8 => split8(elements, rotate, planes),
        _ => unreachable!("elements of 2, 4 or 8 bytes"),
    }
}

#[inline(always)]
fn merge_any(planes: &[&[u8]], width: usize, rotate: bool, elements: &mut [u8]) {
    match width {
        2 => merge2(planes, rotate, elements),
        4 => merge4(planes, rotate, elements),
        8 => merge8(planes, rotate, elements),
        _ => unreachable!("elements of 2, 4 or 8 bytes"),
    }
}

macro_rules! words {
    ($split:ident, $merge:ident, $word:ty, $width:literal) => {
        #[inline(always)]
        fn $split(elements: &[u8], rotate: bool, planes: Vec<&mut [u8]>) {
            let (words, _) = elements.as_chunks::<$width>();
            let n = words.len();
            // The planes held by value, each cut to `n`: stores to them cannot alias their
            // own slices, and every index below is in bounds, so the loop vectorizes.
            let Ok::<[&mut [u8]; $width], _>(planes) = planes.try_into() else {
                unreachable!("one plane per byte of a word");
            };
            let mut planes = planes.map(|plane| &mut plane[..n]);
            for (i, bytes) in words.iter().enumerate() {
                let mut word = <$word>::from_le_bytes(*bytes);
                if rotate {
                    word = word.rotate_left(1);
                }
                for (p, plane) in planes.iter_mut().enumerate() {
                    plane[i] = (word >> (8 * p)) as u8;
                }
            }
        }

        #[inline(always)]
        fn $merge(planes: &[&[u8]], rotate: bool, elements: &mut [u8]) {
            let (words, _) = elements.as_chunks_mut::<$width>();
            let n = words.len();
            let planes: [&[u8]; $width] = std::array::from_fn(|p| &planes[p][..n]);
            for (i, bytes) in words.iter_mut().enumerate() {
                let mut word: $word = 0;
                for (p, plane) in planes.iter().enumerate() {
                    word |= <$word>::from(plane[i]) << (8 * p);
                }
                if rotate {
                    word = word.rotate_right(1);
                }
                *bytes = word.to_le_bytes();
            }
        }
    };
}

words!(split2, merge2, u16, 2);
words!(split4, merge4, u32, 4);
words!(split8, merge8, u64, 8);

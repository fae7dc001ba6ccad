use proptest::prelude::*;

use super::*;
use crate::{DType, ErrorKind};

/// Dtypes of every element width and kind.
fn dtypes() -> Vec<DType> {
    vec![
        DType::U8,
        DType::F8E4M3,
        DType::BF16,
        DType::F16,
        DType::I16,
        DType::F32,
        DType::I32,
        DType::F64,
        DType::U64,
    ]
}

/// Little-endian elements of values spread like trained weights: small, centred on zero, a
/// scale per tensor.
fn weights(seeds: &[u32], scale: f32, width: usize) -> Vec<u8> {
    seeds
        .iter()
        .flat_map(|&s| {
            // The sum of two uniforms: a triangle around zero, denser near it.
            let u = |x: u32| (x % 10_007) as f32 / 10_007.0 - 0.5;
            let v = (u(s) + u(s.rotate_left(13))) * scale;
            let bits = v.to_bits();
            match width {
                2 => ((bits >> 16) as u16).to_le_bytes().to_vec(),
                4 => bits.to_le_bytes().to_vec(),
                _ => f64::from(v).to_bits().to_le_bytes()[..width].to_vec(),
            }
        })
        .collect()
}

/// `elements` bf16 weights and their frame.
fn bf16_piece(elements: u32) -> (Vec<u8>, Vec<u8>) {
    let seeds: Vec<u32> = (0..elements)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let logical = weights(&seeds, 0.04, 2);
    let mut stored = Vec::new();
    assert!(encode_planes(
        &logical,
        Elements::of(&DType::BF16),
        &mut stored
    ));
    (logical, stored)
}

fn round_trip(logical: &[u8], elements: Elements) -> Option<usize> {
    let mut stored = Vec::new();
    if !encode_planes(logical, elements, &mut stored) {
        return None;
    }
    assert!(stored.len() < logical.len());
    let mut back = vec![0xa5; logical.len()];
    Codec::Planes.decode(&stored, &mut back).unwrap();
    assert_eq!(back, logical);
    Some(stored.len())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn weights_of_every_dtype_round_trip_bit_exact(
        seeds in prop::collection::vec(any::<u32>(), 0..3000),
        scale in 1e-4f32..10.0,
        dtype in prop::sample::select(dtypes()),
        cut in 0usize..8,
    ) {
        let elements = Elements::of(&dtype);
        let mut logical = weights(&seeds, scale, elements.width().max(2));
        // Pieces end anywhere: a tensor's last chunk runs on over padding.
        logical.truncate(logical.len().saturating_sub(cut));
        round_trip(&logical, elements);
    }

    #[test]
    fn any_bytes_round_trip_or_stay_raw(
        logical in prop::collection::vec(any::<u8>(), 0..5000),
        dtype in prop::sample::select(dtypes()),
    ) {
        round_trip(&logical, Elements::of(&dtype));
    }

    #[test]
    fn a_damaged_frame_is_refused_or_decodes_to_some_bytes_never_a_panic(
        seeds in prop::collection::vec(any::<u32>(), 64..2000),
        dtype in prop::sample::select(vec![DType::U8, DType::BF16, DType::F32]),
        at in any::<prop::sample::Index>(),
        bit in 0u8..8,
        cut in any::<prop::sample::Index>(),
    ) {
        let elements = Elements::of(&dtype);
        let logical = weights(&seeds, 0.05, elements.width().max(2));
        let mut stored = Vec::new();
        if encode_planes(&logical, elements, &mut stored) {
            let mut back = vec![0; logical.len()];
            let mut flipped = stored.clone();
            flipped[at.index(stored.len())] ^= 1 << bit;
            let _ = Codec::Planes.decode(&flipped, &mut back);
            let short = &stored[..cut.index(stored.len())];
            prop_assert_eq!(
                Codec::Planes.decode(short, &mut back).unwrap_err().kind(),
                ErrorKind::Corrupt
            );
        }
    }
}

#[test]
fn bf16_weights_shrink_by_their_exponent_plane() {
    let seeds: Vec<u32> = (0..50_000u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let logical = weights(&seeds, 0.04, 2);
    let stored = round_trip(&logical, Elements::of(&DType::BF16)).expect("bf16 weights shrink");
    // The exponent plane codes to a few bits a value; the sign and mantissa plane is raw.
    assert!(
        stored * 10 < logical.len() * 8,
        "{stored} of {}",
        logical.len()
    );
}

#[test]
fn zeros_and_noise_take_their_cheapest_form() {
    let zeros = vec![0u8; 1 << 16];
    assert!(round_trip(&zeros, Elements::of(&DType::F32)).unwrap() < 64);
    let noise: Vec<u8> = (0..1u32 << 16)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    assert!(!encode_planes(&noise, Elements::BYTES, &mut Vec::new()));
}

#[test]
fn a_frame_longer_or_shorter_than_the_piece_is_refused() {
    let (logical, stored) = bf16_piece(4000);
    for len in [logical.len() - 2, logical.len() + 2] {
        let mut back = vec![0; len];
        let err = Codec::Planes.decode(&stored, &mut back).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    }
    let mut trailing = stored;
    trailing.push(0);
    let mut back = vec![0; logical.len()];
    let err = Codec::Planes.decode(&trailing, &mut back).unwrap_err();
    assert!(err.to_string().contains("ends at byte"), "{err}");
}

#[test]
fn a_bomb_cannot_make_the_decoder_write_past_the_limit() {
    // One repeated-byte plane would claim any length; the caller's buffer and the limit bound
    // what is written.
    // Width 1, no flags; plane 0 repeated (method 1), 1 byte long: 0x41.
    let frame = [1u8, 0, 1, 1, 0, 0, 0, 0x41];
    let mut small = vec![0u8; 10];
    Codec::Planes.decode(&frame, &mut small).unwrap();
    assert_eq!(small, [0x41; 10]);
    let mut huge = vec![0u8; MAX_ENCODED_LOGICAL_LEN as usize + 1];
    let err = Codec::Planes.decode(&frame, &mut huge).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
}

#[test]
fn an_unknown_codec_is_unsupported_by_name() {
    let err = Codec::from_name("zstd-9").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("`zstd-9`"), "{err}");
    assert_eq!(Codec::from_name("planes").unwrap(), Codec::Planes);
}

#[test]
fn a_float_s_exponent_plane_takes_the_whole_exponent() {
    // Moving the sign below the mantissa leaves the exponent whole in one plane: smaller
    // than splitting the raw bytes, whose high byte mixes sign and seven exponent bits.
    let seeds: Vec<u32> = (0..50_000u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let logical = weights(&seeds, 0.04, 2);
    let rotated = round_trip(&logical, Elements::of(&DType::BF16)).unwrap();
    let plain = round_trip(&logical, Elements::of(&DType::I16)).unwrap();
    assert!(rotated < plain, "{rotated} rotated, {plain} as integers");
}

#[test]
fn flags_a_frame_cannot_have_are_refused() {
    let (logical, mut stored) = bf16_piece(4000);
    stored[1] = 0x81;
    let mut back = vec![0; logical.len()];
    let err = Codec::Planes.decode(&stored, &mut back).unwrap_err();
    assert!(err.to_string().contains("flags"), "{err}");
}

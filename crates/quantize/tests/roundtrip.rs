//! Every mix round-trips: quantize a synthetic f32 model, read the file back with
//! ferrite-gguf, dequantize every tensor and compare with the input.
//!
//! Oracles: (1) the input f32 values, with a per-format bound on the RMS error relative to
//! the tensor's RMS (see `rel_rmse_bound`); (2) kept tensors must be byte-identical; (3) the
//! tensor types must follow the mix rule, written out here independently of the crate's
//! rule code for one model shape.

mod common;

use common::{Shape, llama_f32, values};
use ferrite_gguf::{GgmlType, Gguf};
use ferrite_quantize::{Mix, Progress, QuantizeOptions, plan, quantize_file};

/// Largest RMS error, relative to the RMS of the values, of one format on normal data.
/// Derivation: a uniform quantizer of step `q` has RMS error `q / sqrt(12)`; for blocks of 32
/// normal values the absolute maximum is about 2.2 sigma, so Q4_0 (`q = absmax / 8`) gives
/// about 0.08, Q8_0 (`absmax / 127`) about 0.005, and each extra bit halves the error. The
/// bounds below are those estimates with headroom of about 1.5x; BF16 keeps 8 significant
/// bits (relative error up to 2^-9), F16 11.
fn rel_rmse_bound(ty: GgmlType) -> f64 {
    match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => 0.001,
        GgmlType::BF16 => 0.004,
        GgmlType::Q8_0 => 0.008,
        GgmlType::Q6_K => 0.03,
        GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K => 0.06,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K => 0.12,
        other => panic!("no bound for {other}"),
    }
}

fn rel_rmse(a: &[f32], b: &[f32]) -> f64 {
    let (mut err, mut sig) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        err += f64::from(x - y).powi(2);
        sig += f64::from(*x).powi(2);
    }
    (err / sig.max(f64::MIN_POSITIVE)).sqrt()
}

fn run(input: &Gguf, mix: Mix, dir: &std::path::Path) -> (Gguf, ferrite_quantize::Summary) {
    let out = dir.join(format!("{mix}.gguf"));
    let opts = QuantizeOptions {
        mix,
        threads: 3,
        allow_requantize: false,
    };
    let mut reports = 0usize;
    let summary = quantize_file(input, &out, &opts, &mut |p| {
        if let Progress::Tensor { index, count, .. } = p {
            assert_eq!(index, reports);
            assert_eq!(count, input.tensors().len());
            reports += 1;
        }
    })
    .expect("quantize");
    assert_eq!(reports, input.tensors().len(), "one report per tensor");
    (Gguf::open(&out).expect("output reads back"), summary)
}

/// Checks one output against its input; returns the worst relative error per type.
fn check(input: &Gguf, output: &Gguf, mix: Mix) -> Vec<(GgmlType, f64)> {
    assert_eq!(
        output.get_u64("general.file_type").expect("file type"),
        u64::from(mix.file_type())
    );
    for (k, v) in input.metadata() {
        if k != "general.file_type" {
            assert_eq!(output.get(k), Some(v), "metadata {k} copied");
        }
    }
    let planned = plan(input, mix);
    let mut worst: Vec<(GgmlType, f64)> = Vec::new();
    assert_eq!(output.tensors().len(), input.tensors().len());
    for ((ti, to), p) in input.tensors().iter().zip(output.tensors()).zip(&planned) {
        assert_eq!(
            (&ti.name, &ti.dims),
            (&to.name, &to.dims),
            "order and shape kept"
        );
        assert_eq!(to.ty, p.to, "{} has the planned type", ti.name);
        if ti.dims.len() == 1 {
            assert_eq!(to.ty, GgmlType::F32, "{}: 1-D tensors stay F32", ti.name);
        }
        if to.ty == ti.ty {
            assert_eq!(
                input.tensor_data(ti),
                output.tensor_data(to),
                "{} copied",
                ti.name
            );
            continue;
        }
        let e = rel_rmse(&values(input, &ti.name), &values(output, &to.name));
        let bound = rel_rmse_bound(to.ty);
        assert!(
            e <= bound,
            "{mix} {} as {}: rel rmse {e:.5} > {bound}",
            ti.name,
            to.ty
        );
        match worst.iter_mut().find(|(t, _)| *t == to.ty) {
            Some((_, w)) => *w = w.max(e),
            None => worst.push((to.ty, e)),
        }
    }
    worst
}

#[test]
fn every_mix_round_trips_within_its_error_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shapes = [
        (Shape::K_FRIENDLY, vec![]),
        (
            Shape::ODD,
            vec![
                ("blk.0.narrow.weight", vec![48u64, 4]),
                ("blk.1.ffn_down_exps.weight", vec![288u64, 96, 2]),
            ],
        ),
    ];
    for (shape, extra) in shapes {
        let input = Gguf::from_bytes(llama_f32(shape, &extra)).expect("input");
        for mix in Mix::ALL {
            let (output, summary) = run(&input, mix, dir.path());
            let worst = check(&input, &output, mix);
            println!("{mix} d={}: worst rel rmse per type {worst:?}", shape.d);
            let tensors: usize = summary.types.iter().map(|t| t.tensors).sum();
            assert_eq!(tensors, input.tensors().len());
            assert_eq!(summary.converted + summary.copied, tensors);
            let bytes: u64 = summary.types.iter().map(|t| t.bytes).sum();
            let data: u64 = output.tensors().iter().map(|t| t.n_bytes).sum();
            assert_eq!(bytes, data, "summary bytes are the output's tensor bytes");
        }
    }
}

#[test]
fn q4_k_m_types_follow_the_documented_rule() {
    // Written out by hand from docs/quantize.md for 8 layers: the "more bits" layers are
    // 0 (first eighth), 7 (last eighth) and 3, 6 (every third between).
    let dir = tempfile::tempdir().expect("tempdir");
    let input = Gguf::from_bytes(llama_f32(Shape::K_FRIENDLY, &[])).expect("input");
    let (out, _) = run(&input, Mix::Q4_K_M, dir.path());
    let ty = |n: &str| out.tensor(n).expect(n).ty;
    assert_eq!(ty("output.weight"), GgmlType::Q6_K);
    assert_eq!(ty("token_embd.weight"), GgmlType::Q4_K);
    assert_eq!(ty("output_norm.weight"), GgmlType::F32);
    for l in 0..8 {
        let more = [0, 3, 6, 7].contains(&l);
        let want = if more { GgmlType::Q6_K } else { GgmlType::Q4_K };
        assert_eq!(ty(&format!("blk.{l}.attn_v.weight")), want, "attn_v {l}");
        assert_eq!(
            ty(&format!("blk.{l}.ffn_down.weight")),
            want,
            "ffn_down {l}"
        );
        for other in ["attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"] {
            assert_eq!(ty(&format!("blk.{l}.{other}.weight")), GgmlType::Q4_K);
        }
        assert_eq!(ty(&format!("blk.{l}.attn_norm.weight")), GgmlType::F32);
    }
}

#[test]
fn odd_rows_fall_back_to_32_blocks_or_f16() {
    let dir = tempfile::tempdir().expect("tempdir");
    let extra = [("blk.0.narrow.weight", vec![48u64, 4])];
    let input = Gguf::from_bytes(llama_f32(Shape::ODD, &extra)).expect("input");
    let (out, summary) = run(&input, Mix::Q5_K_M, dir.path());
    let ty = |n: &str| out.tensor(n).expect(n).ty;
    // Tied embedding: the head rule wants Q6_K, 96 is not a multiple of 256 -> Q8_0.
    assert_eq!(ty("token_embd.weight"), GgmlType::Q8_0);
    assert_eq!(ty("blk.0.attn_q.weight"), GgmlType::Q5_1);
    // Two layers: only layer 1 is a "more bits" layer (the last eighth); its Q6_K falls back
    // to Q8_0 (288 values per row), layer 0's Q5_K to Q5_1.
    assert_eq!(ty("blk.0.ffn_down.weight"), GgmlType::Q5_1);
    assert_eq!(ty("blk.1.ffn_down.weight"), GgmlType::Q8_0);
    assert_eq!(ty("blk.0.narrow.weight"), GgmlType::F16);
    assert!(
        summary
            .fallbacks
            .iter()
            .any(|(n, want, got)| n == "blk.0.narrow.weight"
                && *want == GgmlType::Q5_K
                && *got == GgmlType::F16)
    );
}

//! Gradients by parameter, summed where a parameter is used twice (a tied embedding), handed to
//! Burn's optimiser as [`GradientsParams`].

use super::weights::{Vector, Weights};
use crate::Result;
use crate::models::PipelineStage;
use burn::module::ParamId;
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use std::collections::HashMap;

/// Parameter gradients collected by the backward.
#[derive(Debug, Default)]
pub(crate) struct GradSink {
    vectors: HashMap<ParamId, Vec<f32>>,
    matrices: HashMap<ParamId, ([usize; 2], Vec<f32>)>,
}

impl GradSink {
    /// Adds the gradient of a 1-D parameter (nothing for a frozen one).
    pub(crate) fn add_vector(&mut self, p: &Vector, g: Vec<f32>) {
        if !p.trains {
            return;
        }
        match self.vectors.get_mut(&p.id) {
            Some(sum) => super::mm::add_in_place(sum, &g),
            None => {
                self.vectors.insert(p.id, g);
            }
        }
    }

    /// Adds the gradient of a 2-D parameter of `shape`.
    pub(crate) fn add_matrix(&mut self, id: ParamId, shape: [usize; 2], g: Vec<f32>) {
        debug_assert_eq!(g.len(), shape[0] * shape[1]);
        match self.matrices.get_mut(&id) {
            Some((_, sum)) => super::mm::add_in_place(sum, &g),
            None => {
                self.matrices.insert(id, (shape, g));
            }
        }
    }

    /// Sums over the stages of a pipeline the gradients of the parameters every stage holds —
    /// the embedding (made by the first stage's lookups and, when tied, the last stage's head),
    /// the final norm and an untied LM head (the last stage's) — so that every stage applies the
    /// same update to them. One all-reduce, in the same order on every stage.
    ///
    /// # Errors
    /// [`BackendError::Collective`](crate::BackendError::Collective) when the all-reduce fails.
    pub(crate) fn sum_shared(&mut self, w: &Weights, stage: &PipelineStage) -> Result<()> {
        let (vocab, h) = (w.vocab, w.hidden);
        let mut shared: Vec<(ParamId, Option<[usize; 2]>, usize)> = Vec::new();
        if w.embed.trains {
            shared.push((w.embed.id, Some([vocab, h]), vocab * h));
        }
        if w.final_norm.trains {
            shared.push((w.final_norm.id, None, h));
        }
        if let (Some(id), true) = (w.head_id, w.head_trains) {
            shared.push((id, Some([h, vocab]), h * vocab));
        }
        let mut flat = Vec::with_capacity(shared.iter().map(|s| s.2).sum());
        for &(id, shape, len) in &shared {
            let mine = match shape {
                Some(_) => self.matrices.remove(&id).map(|(_, g)| g),
                None => self.vectors.remove(&id),
            };
            flat.extend(mine.unwrap_or_else(|| vec![0.0; len]));
        }
        stage.all_reduce(&mut flat)?;
        let mut rest = flat.as_slice();
        for (id, shape, len) in shared {
            let (g, tail) = rest.split_at(len);
            rest = tail;
            match shape {
                Some(shape) => {
                    self.matrices.insert(id, (shape, g.to_vec()));
                }
                None => {
                    self.vectors.insert(id, g.to_vec());
                }
            }
        }
        Ok(())
    }

    /// The gradients as Burn's optimiser takes them, on `device`.
    pub(crate) fn into_params(self, device: &Device) -> GradientsParams {
        let mut out = GradientsParams::new();
        for (id, g) in self.vectors {
            let n = g.len();
            out.register::<1>(id, Tensor::from_data(TensorData::new(g, [n]), device));
        }
        for (id, (shape, g)) in self.matrices {
            out.register::<2>(id, Tensor::from_data(TensorData::new(g, shape), device));
        }
        out
    }
}

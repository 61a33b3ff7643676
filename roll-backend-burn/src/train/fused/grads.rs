//! Gradients by parameter, summed where a parameter is used twice (a tied embedding), handed to
//! Burn's optimiser as [`GradientsParams`].

use super::weights::Vector;
use crate::engine::cpu::scratch;
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
            Some(sum) => {
                super::mm::add_in_place(sum, &g);
                scratch::recycle(g);
            }
            None => {
                self.vectors.insert(p.id, g);
            }
        }
    }

    /// Adds the gradient of a 2-D parameter of `shape`.
    pub(crate) fn add_matrix(&mut self, id: ParamId, shape: [usize; 2], g: Vec<f32>) {
        debug_assert_eq!(g.len(), shape[0] * shape[1]);
        match self.matrices.get_mut(&id) {
            Some((_, sum)) => {
                super::mm::add_in_place(sum, &g);
                scratch::recycle(g);
            }
            None => {
                self.matrices.insert(id, (shape, g));
            }
        }
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

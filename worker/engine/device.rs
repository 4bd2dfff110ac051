//! Where llama.cpp keeps a model's layers and its KV: the CPU, or one GPU of a backend the
//! build was compiled with (cargo features `vulkan`, `cuda`). Chosen by a layer count and
//! a device index from the settings, and said back (the start-up log, `/v1/info`, each
//! snapshot's header), because a KV computed on another device holds other numbers.

use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::{list_llama_ggml_backend_devices, LlamaBackendDevice, LlamaBackendDeviceType};
use serde::Serialize;

use super::error::{EngineError, Result};

/// What the settings ask for: layers to offload (0 = none; more than the model has = all)
/// and which GPU, counted over the GPU devices llama.cpp lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuChoice {
    pub layers: u32,
    pub main_gpu: u32,
}

impl GpuChoice {
    /// Everything on the CPU.
    pub const CPU: GpuChoice = GpuChoice {
        layers: 0,
        main_gpu: 0,
    };
}

/// Where a loaded model runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// llama.cpp's backend of the device: `CPU`, `Vulkan`, `CUDA`.
    pub backend: String,
    /// The device's name (`CPU`, `Vulkan0`, `CUDA0`).
    pub device: String,
    /// What the driver calls it (`llvmpipe (LLVM 15.0.6, 256 bits)`, a card's name).
    pub description: String,
    /// Layers on the device, of `layers` (the repeating layers and the output layer).
    pub offloaded_layers: u32,
    pub layers: u32,
    /// Where the KV is computed, as an LLKV1 header records it: `CPU`, or the device and
    /// how many of the KV's layers (the repeating layers) are on it (`Vulkan0:30/30`).
    pub kv_device: String,
}

impl Placement {
    fn cpu() -> Placement {
        Placement {
            backend: "CPU".into(),
            device: "CPU".into(),
            description: String::new(),
            offloaded_layers: 0,
            layers: 0,
            kv_device: "CPU".into(),
        }
    }

    /// Completes the counts once the model is loaded: llama.cpp puts the last `asked`
    /// layers (the output layer counted) on the device, the rest on the CPU.
    pub fn with_layers(mut self, n_layer: u32, asked: u32) -> Placement {
        self.layers = n_layer + 1;
        if self.backend == "CPU" {
            return self;
        }
        self.offloaded_layers = asked.min(self.layers);
        let kv_on_device = asked.saturating_sub(1).min(n_layer);
        if kv_on_device > 0 {
            let name: String = self
                .device
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                .collect();
            self.kv_device = format!("{name}:{kv_on_device}/{n_layer}");
        }
        self
    }
}

/// The devices llama.cpp would offload to, in its order (what `main_gpu` counts).
pub fn gpu_devices() -> Vec<LlamaBackendDevice> {
    list_llama_ggml_backend_devices()
        .into_iter()
        .filter(|d| {
            matches!(
                d.device_type,
                LlamaBackendDeviceType::Gpu | LlamaBackendDeviceType::IntegratedGpu
            )
        })
        .collect()
}

/// Model parameters for `choice`, and where they put the model (its layer counts are
/// [`Placement::with_layers`]'s once it is loaded). No layers asked: the model gets no
/// device at all, so a GPU build keeps it on the CPU entirely (llama.cpp would otherwise
/// still send large batches' matrix products to a GPU). Layers asked but no GPU found (a
/// CPU-only build, a machine without one): the CPU, and the caller says so.
pub fn place(choice: GpuChoice) -> Result<(LlamaModelParams, Placement)> {
    let no_device = |params: LlamaModelParams| {
        params
            .with_n_gpu_layers(0)
            .with_devices(&[])
            .map_err(|e| EngineError::Context(format!("device list: {e}")))
    };
    if choice.layers == 0 {
        return Ok((no_device(LlamaModelParams::default())?, Placement::cpu()));
    }
    let gpus = gpu_devices();
    if gpus.is_empty() {
        return Ok((no_device(LlamaModelParams::default())?, Placement::cpu()));
    }
    let Some(dev) = gpus.get(choice.main_gpu as usize) else {
        return Err(EngineError::Context(format!(
            "engine.main_gpu is {}, but llama.cpp lists {} GPU device(s): {}",
            choice.main_gpu,
            gpus.len(),
            gpus.iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    let params = LlamaModelParams::default()
        .with_n_gpu_layers(choice.layers)
        .with_devices(&[dev.index])
        .map_err(|e| EngineError::Context(format!("device {}: {e}", dev.name)))?;
    let placement = Placement {
        backend: dev.backend.clone(),
        device: dev.name.clone(),
        description: dev.description.clone(),
        ..Placement::cpu()
    };
    Ok((params, placement))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(device: &str) -> Placement {
        Placement {
            backend: "Vulkan".into(),
            device: device.into(),
            ..Placement::cpu()
        }
    }

    #[test]
    fn layers_count_from_the_output_end() {
        // 30 repeating layers + the output layer; llama.cpp offloads from the output end.
        let all = on("Vulkan0").with_layers(30, 999);
        assert_eq!((all.offloaded_layers, all.layers), (31, 31));
        assert_eq!(all.kv_device, "Vulkan0:30/30");
        let output_only = on("Vulkan0").with_layers(30, 1);
        assert_eq!(output_only.offloaded_layers, 1);
        assert_eq!(output_only.kv_device, "CPU");
        let some = on("Vulkan 0\n").with_layers(30, 11);
        assert_eq!(some.kv_device, "Vulkan0:10/30");
        let cpu = Placement::cpu().with_layers(30, 999);
        assert_eq!((cpu.offloaded_layers, cpu.kv_device.as_str()), (0, "CPU"));
    }

    #[test]
    fn no_layers_means_no_device() {
        let (params, placement) = place(GpuChoice::CPU).unwrap();
        assert_eq!(params.n_gpu_layers(), 0);
        assert!(params.devices().is_empty());
        assert_eq!(placement.backend, "CPU");
    }
}

# One-process torch.distributed run on the gloo backend (what vLLM's CPU worker uses),
# with NCCL_DEBUG=INFO and a profile's NCCL variables in the environment.
import os, tempfile, torch, torch.distributed as dist
print(f"torch {torch.__version__} cuda={torch.version.cuda} nccl_available={dist.is_nccl_available()}", flush=True)
print("env:", " ".join(f"{k}={os.environ[k]}" for k in sorted(os.environ) if k.startswith(("NCCL_", "CUDA_DEVICE"))), flush=True)
init = "file://" + tempfile.mktemp(prefix="gloo_probe_")
dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
t = torch.ones(4)
dist.all_reduce(t)
print(f"backend={dist.get_backend()} all_reduce -> {t.tolist()}", flush=True)
dist.destroy_process_group()

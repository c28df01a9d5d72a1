"""The data path of a run: the loop, the engine and its CUDA streams, the float16 fallback, loading the
stages, assembling a run."""

"""Quantized weights: GGUF blocks and float checkpoints into the packed format of
`kernels.quant_format`, and the matmuls that read them on each device."""

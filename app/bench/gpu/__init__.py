"""`kvscope bench --gpu`: paged-attention decode on a CUDA GPU, kernel by kernel and end to end."""

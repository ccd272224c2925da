"""`kvscope bench --soak`: `kvscope serve` driven for minutes by polite and hostile clients and
a hostile peer, watched from outside, with a verdict."""

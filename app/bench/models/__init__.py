"""`kvscope bench --models`: what loading models of the sizes people run costs, one fresh process
each."""

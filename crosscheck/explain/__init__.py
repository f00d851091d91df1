"""`python -m crosscheck explain`: the guided walkthrough of the RL math and its gradients.

`topics` computes each topic live (both twins, both gradient paths, confirmed equal); `text`
holds its words in English and Chinese; `plots` draws the figures. Importing this package does
not import torch (the command line's --help reads TOPICS from here).
"""
TOPICS = ("gae", "whiten", "ppo", "grpo", "cispo", "kl", "compare", "beyond")

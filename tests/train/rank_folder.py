"""`foxformer train` run from ``BASE<RANK>/`` on each rank: ``python rank_folder.py BASE <train args>`` (under
torchrun). A relative --out then names another folder on each rank, as a local disk on each host would."""
import os
import sys

from foxformer.cli import main

folder = sys.argv[1] + os.environ["RANK"]
os.makedirs(folder, exist_ok=True)
os.chdir(folder)
sys.exit(main(["train", *sys.argv[2:]]))

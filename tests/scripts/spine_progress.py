"""A progress bar redrawn with carriage returns (as tqdm draws it on stderr), a normal line, and with
--hang a bar that stays unfinished while the script waits."""
import sys
import time

for i in range(1, 51):
    sys.stderr.write(f"\rbatch {i}/50")
    sys.stderr.flush()
    time.sleep(0.002)
sys.stderr.write("\n")
sys.stderr.flush()
time.sleep(0.3)          # the two streams are copied by two threads: keep their order in log.txt plain
print("epoch done", flush=True)
if "--hang" in sys.argv:
    sys.stderr.write("\rwaiting for the next epoch 0%")
    sys.stderr.flush()
    time.sleep(120)

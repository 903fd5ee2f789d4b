"""What checks/dataloader.py needs beyond the core probe: ``step.extra["pre_forward_s"]``, the main
thread's own batch-building time before a step's first training forward. (Host-to-device copies,
``extras.copies``, are counted inside the CUDA sync window: :mod:`diag.probe.perf.sync`.)"""
from __future__ import annotations


class DataloaderRecorder:
    def _pre_forward_gap(self, probe) -> None:
        """Seconds between the previous step's end and this step's first training forward, minus the
        DataLoader wait and eval forwards in between."""
        st = probe.current_step
        if st is not None and st.n_forward == 1:
            # from when the probe finished closing the last step (its own work is not the user's)
            start = max(st.start, probe.step_closed_at)
            gap = probe.forward_start - start - st.data_s - st.eval_s
            st.extra["pre_forward_s"] = round(gap if gap > 0 else 0.0, 7)

"""What checks/parallel.py needs: per nn.DataParallel model, its device_ids (``extras.data_parallel``)."""
from __future__ import annotations


class ParallelRecorder:
    def _init_parallel(self) -> None:
        self.data_parallel: dict[str, dict] = {}

    def _model_parallel(self, module, info) -> None:
        wrappers = info.get("wrappers") or []
        mid = info["id"]
        if "DataParallel" in wrappers:
            dp = module
            for _ in range(4):
                if type(dp).__name__ == "DataParallel":
                    break
                dp = getattr(dp, "module", None) or getattr(dp, "_orig_mod", None)
                if dp is None:
                    break
            if dp is not None and type(dp).__name__ == "DataParallel":
                self.data_parallel[str(mid)] = {
                    "device_ids": [str(d) for d in (getattr(dp, "device_ids", None) or [])],
                    "output_device": str(getattr(dp, "output_device", None)),
                }
                self._mark("data_parallel", now=True)

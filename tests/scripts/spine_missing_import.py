import torch  # noqa: F401
import a_module_that_does_not_exist_anywhere  # noqa: F401

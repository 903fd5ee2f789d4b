"""A training loop whose loss is a module (nn.CrossEntropyLoss) called beside the model, and an
evaluation through a parameterless wrapper module that calls the model: one model, one batch per step."""
import torch
import torch.nn as nn


class Scored(nn.Module):
    """No parameters of its own: the model is held outside the module tree."""

    def __init__(self, model):
        super().__init__()
        self.__dict__["model"] = model

    def forward(self, x):
        return self.model(x).softmax(-1)       # INNER-CALL


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(6):
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        opt.zero_grad()
        loss = loss_fn(model(x), y)              # LOSS-LINE
        loss.backward()
        opt.step()
    scored = Scored(model)
    model.eval()
    with torch.no_grad():
        for _ in range(3):
            scored(torch.randn(5, 16))           # WRAPPED-EVAL


if __name__ == "__main__":
    main()

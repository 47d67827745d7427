"""Export a small ResNet-style CNN (random weights) to ONNX with torch.onnx (dynamo).

Stem (3x3 conv 3->16, BatchNorm, ReLU), one basic block at 16 channels, one down-sampling
basic block 16->32 (stride 2, 1x1 conv shortcut), global average pool and a 10-way linear
head; input [batch, 3, 32, 32] with a dynamic batch axis. Writes resnet_block.onnx next
to this script. Run as described in make_qwen3_tiny.py.
"""

from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent


class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + self.shortcut(x))


class TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layer1 = BasicBlock(16, 16)
        self.layer2 = BasicBlock(16, 32, stride=2)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def main():
    torch.manual_seed(0)
    model = TinyResNet().eval()
    x = torch.randn(2, 3, 32, 32)
    out = HERE / "resnet_block.onnx"
    program = torch.onnx.export(model, (x,), dynamo=True, opset_version=18,
                                dynamic_shapes={"x": {0: torch.export.Dim("batch_size", min=1, max=256)}},
                                input_names=["x"], output_names=["logits"])
    program.save(str(out))
    print(f"{out.name}: {out.stat().st_size:,} bytes (torch {torch.__version__})")


if __name__ == "__main__":
    main()

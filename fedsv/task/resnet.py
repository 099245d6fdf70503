"""A ResNet-18 for 32x32 images (He et al. 2016, CIFAR variant: 3x3 stem, no max pooling), in fedsv."""

from __future__ import annotations

from torch import Tensor, nn


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm, and the shortcut (a 1x1 projection where the shape changes)."""

    def __init__(self, channels_in: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or channels_in != channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels_in, channels, 1, stride=stride, bias=False), nn.BatchNorm2d(channels)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 for 3x32x32 inputs: 11.2 M parameters, about 0.56 GFLOP per image (torchvision's
    resnet18 cannot be imported with the CPU torch this project pins, so it is written here)."""

    def __init__(self, input_shape: tuple[int, ...] = (3, 32, 32), num_classes: int = 10) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"ResNet18 expects CxHxW images, got {input_shape}")
        self.input_shape = tuple(int(d) for d in input_shape)
        self.conv1 = nn.Conv2d(self.input_shape[0], 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        stages: list[nn.Module] = []
        channels_in = 64
        for channels, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(
                nn.Sequential(BasicBlock(channels_in, channels, stride), BasicBlock(channels, channels, 1))
            )
            channels_in = channels
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.fc(self.flatten(self.pool(out)))

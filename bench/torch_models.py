"""The networks of pstrain's models/ in PyTorch, layer for layer, so that the
benchmarks compare the same computation: same layers, shapes, parameter
counts (checked against `pstrain summary` by torch_step_bench.py --check),
MXNet's pooling rounding ("full" = ceil_mode) and BatchNorm settings.

  build(name, image_shape=(C, H, W), num_classes=10, num_layers=0) -> nn.Module
"""
import torch.nn as nn

FULL = True  # MXNet's 2015 "full" pooling rounding is PyTorch's ceil_mode


def conv(cin, cout, k, s=1, p=0, bias=True):
    kh, kw = (k, k) if isinstance(k, int) else k
    ph, pw = (p, p) if isinstance(p, int) else p
    return nn.Conv2d(cin, cout, (kh, kw), stride=s, padding=(ph, pw), bias=bias)


class Concat(nn.Module):
    def __init__(self, *branches):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x):
        import torch
        return torch.cat([b(x) for b in self.branches], 1)


def bn(c, eps, momentum=0.9, fix_gamma=False):
    # PyTorch's momentum is the weight of the new batch: MXNet's 0.9 is 0.1 here.
    m = nn.BatchNorm2d(c, eps=eps, momentum=1 - momentum, affine=True)
    if fix_gamma:
        m.weight.requires_grad_(False)
    return m


# ---- mlp, lenet, the seed networks ----

def mlp(c, h, w, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 128), nn.ReLU(), nn.Linear(128, 64),
                         nn.ReLU(), nn.Linear(64, classes))


def lenet(c, h, w, classes):
    oh, ow = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
    return nn.Sequential(conv(c, 20, 5), nn.Tanh(), nn.MaxPool2d(2, 2), conv(20, 50, 5), nn.Tanh(),
                         nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(50 * oh * ow, 500),
                         nn.Tanh(), nn.Linear(500, classes))


def keras_mnist_cnn(c, h, w, classes):
    oh, ow = (h - 4) // 2, (w - 4) // 2
    return nn.Sequential(conv(c, 32, 3), nn.ReLU(), conv(32, 32, 3), nn.ReLU(), nn.MaxPool2d(2, 2),
                         nn.Dropout(0.25), nn.Flatten(), nn.Linear(32 * oh * ow, 128), nn.ReLU(),
                         nn.Dropout(0.5), nn.Linear(128, classes))


def neon_cifar10_conv(c, h, w, classes):
    oh, ow = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
    return nn.Sequential(conv(c, 16, 5), bn(16, 1e-3), nn.ReLU(), nn.MaxPool2d(2, 2),
                         conv(16, 32, 5), bn(32, 1e-3), nn.ReLU(), nn.MaxPool2d(2, 2),
                         nn.Flatten(), nn.Linear(32 * oh * ow, 500),
                         nn.BatchNorm1d(500, eps=1e-3, momentum=0.1), nn.ReLU(),
                         nn.Linear(500, classes))


# ---- Inception-BN ----

BN_EPS = 1e-5 + 1e-10


def conv_factory(cin, cout, k, s=1, p=0):
    return nn.Sequential(conv(cin, cout, k, s, p), bn(cout, BN_EPS), nn.ReLU())


def classifier(cin, classes):
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


def inception_bn_28_small(c, h, w, classes):
    def simple(cin, c1, c3):
        return Concat(conv_factory(cin, c1, 1), conv_factory(cin, c3, 3, 1, 1)), c1 + c3

    def down(cin, c3):
        return Concat(conv_factory(cin, c3, 3, 2, 1),
                      nn.MaxPool2d(3, 2, ceil_mode=FULL)), c3 + cin

    layers, ch = [conv_factory(c, 96, 3, 1, 1)], 96
    for kind, *a in [("s", 32, 32), ("s", 32, 48), ("d", 80), ("s", 112, 48), ("s", 96, 64),
                     ("s", 80, 80), ("s", 48, 96), ("d", 96), ("s", 176, 160), ("s", 176, 160)]:
        block, ch = simple(ch, *a) if kind == "s" else down(ch, *a)
        layers.append(block)
    layers.append(classifier(ch, classes))
    return nn.Sequential(*layers)


# ---- Inception-v3 (MXNet's symbol_inception-v3.py) ----

def v3conv(cin, cout, k, s=1, p=0):
    return nn.Sequential(conv(cin, cout, k, s, p, bias=False), bn(cout, 1e-3, fix_gamma=True),
                         nn.ReLU())


def v3_pool(kind):
    return (nn.AvgPool2d(3, 1, 1, count_include_pad=True) if kind == "avg" else
            nn.MaxPool2d(3, 1, 1))


def v3a(cin, n1, n3r, n31, n32, n5r, n5, pool, proj):
    return Concat(v3conv(cin, n1, 1),
                  nn.Sequential(v3conv(cin, n5r, 1), v3conv(n5r, n5, 5, 1, 2)),
                  nn.Sequential(v3conv(cin, n3r, 1), v3conv(n3r, n31, 3, 1, 1),
                                v3conv(n31, n32, 3, 1, 1)),
                  nn.Sequential(v3_pool(pool), v3conv(cin, proj, 1))), n1 + n5 + n32 + proj


def v3b(cin, n3, nd3r, nd31, nd32):
    return Concat(v3conv(cin, n3, 3, 2),
                  nn.Sequential(v3conv(cin, nd3r, 1), v3conv(nd3r, nd31, 3, 1, 1),
                                v3conv(nd31, nd32, 3, 2)),
                  nn.MaxPool2d(3, 2)), n3 + nd32 + cin


def v3c(cin, n1, d7r, d71, d72, q7r, q71, q72, q73, q74, pool, proj):
    return Concat(v3conv(cin, n1, 1),
                  nn.Sequential(v3conv(cin, d7r, 1), v3conv(d7r, d71, (1, 7), 1, (0, 3)),
                                v3conv(d71, d72, (7, 1), 1, (3, 0))),
                  nn.Sequential(v3conv(cin, q7r, 1), v3conv(q7r, q71, (7, 1), 1, (3, 0)),
                                v3conv(q71, q72, (1, 7), 1, (0, 3)),
                                v3conv(q72, q73, (7, 1), 1, (3, 0)),
                                v3conv(q73, q74, (1, 7), 1, (0, 3))),
                  nn.Sequential(v3_pool(pool), v3conv(cin, proj, 1))), n1 + d72 + q74 + proj


def v3d(cin, n3r, n3, d7r, d71, d72, d73):
    return Concat(nn.Sequential(v3conv(cin, n3r, 1), v3conv(n3r, n3, 3, 2)),
                  nn.Sequential(v3conv(cin, d7r, 1), v3conv(d7r, d71, (1, 7), 1, (0, 3)),
                                v3conv(d71, d72, (7, 1), 1, (3, 0)), v3conv(d72, d73, 3, 2)),
                  nn.MaxPool2d(3, 2)), n3 + d73 + cin


class V3E(nn.Module):
    def __init__(self, cin, n1, d3r, d31, d32, t3r, t3, t31, t32, pool, proj):
        super().__init__()
        self.a = v3conv(cin, n1, 1)
        self.d = v3conv(cin, d3r, 1)
        self.da = v3conv(d3r, d31, (1, 3), 1, (0, 1))
        self.db = v3conv(d3r, d32, (3, 1), 1, (1, 0))
        self.t = nn.Sequential(v3conv(cin, t3r, 1), v3conv(t3r, t3, 3, 1, 1))
        self.ta = v3conv(t3, t31, (1, 3), 1, (0, 1))
        self.tb = v3conv(t3, t32, (3, 1), 1, (1, 0))
        self.p = nn.Sequential(v3_pool(pool), v3conv(cin, proj, 1))
        self.out = n1 + d31 + d32 + t31 + t32 + proj

    def forward(self, x):
        import torch
        d, t = self.d(x), self.t(x)
        return torch.cat([self.a(x), self.da(d), self.db(d), self.ta(t), self.tb(t), self.p(x)], 1)


def inception_v3(c, h, w, classes):
    layers = [v3conv(c, 32, 3, 2), v3conv(32, 32, 3), v3conv(32, 64, 3, 1, 1), nn.MaxPool2d(3, 2),
              v3conv(64, 80, 1), v3conv(80, 192, 3), nn.MaxPool2d(3, 2)]
    ch = 192
    for a in [(64, 64, 96, 96, 48, 64, "avg", 32), (64, 64, 96, 96, 48, 64, "avg", 64),
              (64, 64, 96, 96, 48, 64, "avg", 64)]:
        m, ch = v3a(ch, *a)
        layers.append(m)
    m, ch = v3b(ch, 384, 64, 96, 96)
    layers.append(m)
    for a in [(192, 128, 128, 192, 128, 128, 128, 128, 192, "avg", 192),
              (192, 160, 160, 192, 160, 160, 160, 160, 192, "avg", 192),
              (192, 160, 160, 192, 160, 160, 160, 160, 192, "avg", 192),
              (192, 192, 192, 192, 192, 192, 192, 192, 192, "avg", 192)]:
        m, ch = v3c(ch, *a)
        layers.append(m)
    m, ch = v3d(ch, 192, 320, 192, 192, 192, 192)
    layers.append(m)
    for pool in ("avg", "max"):
        m = V3E(ch, 320, 384, 384, 384, 448, 384, 384, 384, pool, 192)
        ch = m.out
        layers.append(m)
    layers.append(classifier(ch, classes))
    return nn.Sequential(*layers)


# ---- pre-activation ResNet (MXNet's symbols/resnet.py) ----

RESNET_EPS = 2e-5


class ResidualUnit(nn.Module):
    def __init__(self, cin, filters, stride, dim_match, bottleneck):
        super().__init__()
        self.bn1 = bn(cin, RESNET_EPS)
        if bottleneck:
            inner = filters // 4
            self.body = nn.Sequential(
                conv(cin, inner, 1, bias=False), bn(inner, RESNET_EPS), nn.ReLU(),
                conv(inner, inner, 3, stride, 1, bias=False), bn(inner, RESNET_EPS), nn.ReLU(),
                conv(inner, filters, 1, bias=False))
        else:
            self.body = nn.Sequential(
                conv(cin, filters, 3, stride, 1, bias=False), bn(filters, RESNET_EPS), nn.ReLU(),
                conv(filters, filters, 3, 1, 1, bias=False))
        self.sc = None if dim_match else conv(cin, filters, 1, stride, 0, bias=False)

    def forward(self, x):
        act = nn.functional.relu(self.bn1(x))
        return self.body(act) + (x if self.sc is None else self.sc(act))


def resnet(c, h, w, classes, layers):
    cifar = h <= 32
    if cifar:
        if layers >= 164 and (layers - 2) % 9 == 0:
            units, filters, bottleneck = [(layers - 2) // 9] * 3, [16, 64, 128, 256], True
        elif 2 < layers < 164 and (layers - 2) % 6 == 0:
            units, filters, bottleneck = [(layers - 2) // 6] * 3, [16, 16, 32, 64], False
        else:
            raise SystemExit("resnet on CIFAR needs 6n+2 or 9n+2 layers")
    else:
        units = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3], 101: [3, 4, 23, 3],
                 152: [3, 8, 36, 3], 200: [3, 24, 36, 3], 269: [3, 30, 48, 8]}[layers]
        bottleneck = layers >= 50
        filters = [64, 256, 512, 1024, 2048] if bottleneck else [64, 64, 128, 256, 512]
    mods = [bn(c, RESNET_EPS, fix_gamma=True)]
    if cifar:
        mods.append(conv(c, filters[0], 3, 1, 1, bias=False))
    else:
        mods += [conv(c, filters[0], 7, 2, 3, bias=False), bn(filters[0], RESNET_EPS), nn.ReLU(),
                 nn.MaxPool2d(3, 2, 1)]
    ch = filters[0]
    for i, n in enumerate(units):
        for j in range(n):
            mods.append(ResidualUnit(ch, filters[i + 1], 2 if (i > 0 and j == 0) else 1, j > 0,
                                     bottleneck))
            ch = filters[i + 1]
    mods += [bn(ch, RESNET_EPS), nn.ReLU(), classifier(ch, classes)]
    return nn.Sequential(*mods)


def build(name, image_shape=(1, 28, 28), num_classes=10, num_layers=0):
    c, h, w = image_shape
    table = {"mlp": mlp, "lenet": lenet, "keras-mnist-cnn": keras_mnist_cnn,
             "neon-cifar10-conv": neon_cifar10_conv,
             "inception-bn-28-small": inception_bn_28_small, "inception-v3": inception_v3}
    if name == "resnet":
        return resnet(c, h, w, num_classes, num_layers or 50)
    if name not in table:
        raise SystemExit("unknown network " + name)
    return table[name](c, h, w, num_classes)


def num_params(model):
    """Trainable parameters as pstrain counts them (fix_gamma's gamma included:
    MXNet keeps it as a parameter, held at 1)."""
    return sum(p.numel() for p in model.parameters())

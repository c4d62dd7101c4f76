"""Dense prediction on InLine backbones: semantic segmentation (SemanticFPN, UperNet), its
metrics and data (ADE20K, Fashion-MNIST mosaics), and an OpenMMLab plugin (``dense.mm``)."""

from .backbone import DenseBackbone, LayerNorm2d, SimpleFeaturePyramid
from .heads import FCNHead, FPN, FPNHead, PPM, UPerHead
from .losses import seg_cross_entropy
from .metrics import SegMetric, confusion_matrix, metrics_from_confusion
from .mosaic import MOSAIC_CLASSES, FashionMosaics, MosaicSpec, make_mosaic
from .segmentor import EncoderDecoder, build_segmentor, slide_windows

__all__ = [
    "DenseBackbone",
    "EncoderDecoder",
    "FCNHead",
    "FPN",
    "FPNHead",
    "FashionMosaics",
    "LayerNorm2d",
    "MOSAIC_CLASSES",
    "MosaicSpec",
    "PPM",
    "SegMetric",
    "SimpleFeaturePyramid",
    "UPerHead",
    "build_segmentor",
    "confusion_matrix",
    "make_mosaic",
    "metrics_from_confusion",
    "seg_cross_entropy",
    "slide_windows",
]

"""Dense prediction on InLine backbones: semantic segmentation (SemanticFPN, UperNet) and
object detection (FCOS), their metrics (mIoU; COCO box AP) and data (ADE20K, COCO, Fashion-MNIST
mosaics), and an OpenMMLab plugin for mmseg and mmdet (``dense.mm``).

Three blocks: :mod:`.data` (data sets, augmentation, the COCO format), :mod:`.models` (backbone
adapter, heads, segmentor, detector, boxes, losses) and, at this package's top, the tasks
(``seg_task``, ``det_task``, their shared ``build``), their config, evaluation helpers, metrics,
pictures and the mm plugin, which take from the two blocks below them."""

from .models.backbone import DenseBackbone, LayerNorm2d, SimpleFeaturePyramid
from .models.boxes import batched_nms, box_iou, decode_ltrb, encode_ltrb, nms
from .data.coco import CocoDetection, coco_box_ap
from .models.detector import FCOS, build_detector
from .models.heads import FCNHead, FPN, FPNHead, PPM, UPerHead
from .models.losses import giou_loss, seg_cross_entropy, sigmoid_focal_loss
from .metrics import SegMetric, confusion_matrix, metrics_from_confusion
from .data.mosaic import MOSAIC_CLASSES, FashionMosaics, MosaicSpec, make_mosaic
from .models.segmentor import EncoderDecoder, build_segmentor, slide_windows

__all__ = [
    "CocoDetection",
    "DenseBackbone",
    "EncoderDecoder",
    "FCNHead",
    "FCOS",
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
    "batched_nms",
    "box_iou",
    "build_detector",
    "build_segmentor",
    "coco_box_ap",
    "confusion_matrix",
    "decode_ltrb",
    "encode_ltrb",
    "giou_loss",
    "make_mosaic",
    "metrics_from_confusion",
    "nms",
    "seg_cross_entropy",
    "sigmoid_focal_loss",
    "slide_windows",
]

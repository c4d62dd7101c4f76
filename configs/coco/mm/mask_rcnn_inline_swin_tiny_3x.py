# InLine-Swin-Tiny + Mask R-CNN, COCO 3x (36 epochs, multi-scale 480-800). A classification
# checkpoint initialises the backbone: backbone=dict(init_cfg=dict(type="Pretrained", checkpoint=PATH)).
_base_ = ["./_mask_rcnn.py", "./_schedule_3x_swin.py"]
model = dict(
    backbone=dict(name="inline_swin_tiny", drop_path_rate=0.2),
    neck=dict(in_channels=[96, 192, 384, 768]),
)

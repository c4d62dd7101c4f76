# InLine-PVT-Medium + Mask R-CNN, COCO 1x (12 epochs). A classification checkpoint initialises the
# backbone: backbone=dict(init_cfg=dict(type="Pretrained", checkpoint=PATH)).
_base_ = ["./_mask_rcnn.py", "./_schedule_1x_pvt.py"]
model = dict(backbone=dict(name="inline_pvt_medium"))

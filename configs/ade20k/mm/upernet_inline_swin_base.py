# InLine-Swin-Base + UperNet, ADE20K 512 x 512, 160k iterations. A classification checkpoint
# initialises the backbone: backbone=dict(init_cfg=dict(type="Pretrained", checkpoint=PATH)).
_base_ = ["./_upernet.py"]
model = dict(
    backbone=dict(name="inline_swin_base"),
    decode_head=dict(in_channels=[128, 256, 512, 1024]),
    auxiliary_head=dict(in_channels=512),
)
